"""Handlers for cluster and topic administration: ApiVersions, Metadata, DescribeCluster,
CreateTopics, DeleteTopics, DescribeConfigs.

Each handler takes the shared `BrokerState` and a decoded `Request` and returns a response object
built at the request's version. Topic metadata comes from the store; this module never reads logs.
"""

from __future__ import annotations

import dataclasses
import logging

from kafka.protocol.admin import (
    CreateTopicsResponse,
    DeleteTopicsResponse,
    DescribeClusterResponse,
    DescribeConfigsResponse,
)
from kafka.protocol.metadata import MetadataResponse

from infra.broker import errors
from infra.broker.protocol import ErrorCode, Request, api_versions_body
from infra.broker.state import BrokerState
from infra.broker.store import topic_defaults

log = logging.getLogger(__name__)

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
CONFIG_SOURCE_TOPIC = 1  # DYNAMIC_TOPIC_CONFIG
CONFIG_SOURCE_DEFAULT = 5  # DEFAULT_CONFIG
CONFIG_TYPE_STRING = 2

# storage errors -> Kafka error codes, for the admin paths
STORAGE_ERRORS: tuple[tuple[type[Exception], int], ...] = (
    (errors.TopicExistsError, ErrorCode.TOPIC_ALREADY_EXISTS),
    (errors.InvalidTopicError, ErrorCode.INVALID_TOPIC_EXCEPTION),
    (errors.InvalidPartitionsError, ErrorCode.INVALID_PARTITIONS),
    (errors.InvalidConfigError, ErrorCode.INVALID_CONFIG),
    (errors.UnknownTopicError, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
)


def storage_error_code(exc: Exception) -> int:
    for exc_type, code in STORAGE_ERRORS:
        if isinstance(exc, exc_type):
            return code
    return ErrorCode.UNKNOWN_SERVER_ERROR


async def handle_api_versions(state: BrokerState, req: Request):
    return api_versions_body(state.profile, req.api_version)


# -- Metadata ------------------------------------------------------------------------------------


async def handle_metadata(state: BrokerState, req: Request):
    body, version = req.body, req.api_version
    may_create = state.config.auto_create_topics and (version < 4 or body.allow_auto_topic_creation)
    names = _requested_topic_names(state, body, version)
    topics = [_topic_metadata(state, name, may_create) for name in names]
    broker = MetadataResponse.MetadataResponseBroker(
        node_id=state.node_id, host=state.advertised_host, port=state.advertised_port, rack=None
    )
    return MetadataResponse(
        version=version,
        throttle_time_ms=0,
        brokers=[broker],
        cluster_id=state.cluster_id,
        controller_id=state.node_id,  # faust sends CreateTopics to the controller: it must be live
        topics=topics,
    )


def _requested_topic_names(state: BrokerState, body, version: int) -> list[str]:
    """None (v1+) or an empty list (v0) means every topic."""
    if body.topics is None or (version == 0 and not body.topics):
        return sorted(state.store.topics())
    names = []
    for topic in body.topics:
        if topic.name is None and getattr(topic, "topic_id", None) is not None:
            meta = state.store.topic_by_id(topic.topic_id)
            names.append(meta.name if meta is not None else str(topic.topic_id))
        else:
            names.append(topic.name)
    return names


def _topic_metadata(state: BrokerState, name: str, may_create: bool):
    topic_class = MetadataResponse.MetadataResponseTopic
    meta = state.store.topic(name)
    if meta is None and may_create:
        meta, code = create_topic(state, name, state.config.default_partitions, {})
        if meta is None and code != ErrorCode.TOPIC_ALREADY_EXISTS:
            return topic_class(error_code=code, name=name, partitions=[])
        meta = meta or state.store.topic(name)
    if meta is None:
        return topic_class(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name, partitions=[])
    partition_class = topic_class.MetadataResponsePartition
    node = state.node_id
    partitions = [
        partition_class(
            error_code=0,
            partition_index=index,
            leader_id=node,
            leader_epoch=0,  # stable: kafka-python commits it and may validate it
            replica_nodes=[node],
            isr_nodes=[node],
            offline_replicas=[],
        )
        for index in range(meta.partitions)
    ]
    return topic_class(
        error_code=0, name=name, topic_id=meta.topic_id, is_internal=False, partitions=partitions
    )


def create_topic(state: BrokerState, name: str, partitions: int, configs: dict[str, str]):
    """Create a topic in the store; returns (TopicMeta or None, error code)."""
    try:
        meta = state.store.create_topic(name, partitions, configs)
    except errors.BrokerStorageError as exc:
        return None, storage_error_code(exc)
    return meta, ErrorCode.NONE


async def handle_describe_cluster(state: BrokerState, req: Request):
    broker = DescribeClusterResponse.DescribeClusterBroker(
        broker_id=state.node_id, host=state.advertised_host, port=state.advertised_port, rack=None
    )
    return DescribeClusterResponse(
        version=req.api_version,
        throttle_time_ms=0,
        error_code=0,
        error_message=None,
        endpoint_type=1,
        cluster_id=state.cluster_id,
        controller_id=state.node_id,
        brokers=[broker],
    )


# -- CreateTopics / DeleteTopics -----------------------------------------------------------------


async def handle_create_topics(state: BrokerState, req: Request):
    body = req.body
    validate_only = bool(getattr(body, "validate_only", False))
    results = [_create_one(state, topic, validate_only) for topic in body.topics]
    return CreateTopicsResponse(version=req.api_version, throttle_time_ms=0, topics=results)


def _create_one(state: BrokerState, topic, validate_only: bool):
    result_class = CreateTopicsResponse.CreatableTopicResult
    configs = {c.name: c.value for c in topic.configs if c.value is not None}
    partitions = topic.num_partitions if topic.num_partitions > 0 else state.config.default_partitions
    error, message = _creation_error(state, topic, partitions)
    if error is None and not validate_only:
        meta, error = create_topic(state, topic.name, partitions, configs)
        message = _creation_message(error, topic.name, partitions)
    if error:
        return result_class(
            name=topic.name,
            error_code=error,
            error_message=message,
            num_partitions=-1,
            replication_factor=-1,
            configs=[],
        )
    config_class = result_class.CreatableTopicConfigs
    topic_id = meta.topic_id if not validate_only else None
    return result_class(
        name=topic.name,
        topic_id=topic_id,
        error_code=0,
        error_message=None,
        num_partitions=partitions,
        replication_factor=1,
        configs=[
            config_class(
                name=k, value=v, read_only=False, config_source=CONFIG_SOURCE_TOPIC, is_sensitive=False
            )
            for k, v in sorted(configs.items())
        ],
    )


def _creation_error(state: BrokerState, topic, partitions: int) -> tuple[int | None, str | None]:
    if state.store.topic(topic.name) is not None:
        return ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{topic.name}' already exists."
    if topic.replication_factor not in (-1, 1):
        message = f"replication_factor={topic.replication_factor}: this single-node broker only supports 1"
        return ErrorCode.INVALID_REPLICATION_FACTOR, message
    if partitions < 1:
        return ErrorCode.INVALID_PARTITIONS, f"num_partitions={partitions} must be at least 1"
    return None, None


def _creation_message(error: int, name: str, partitions: int) -> str | None:
    if error == ErrorCode.NONE:
        return None
    if error == ErrorCode.TOPIC_ALREADY_EXISTS:
        return f"Topic '{name}' already exists."
    return f"cannot create topic {name!r} with {partitions} partition(s): {ErrorCode(error).name}"


async def handle_delete_topics(state: BrokerState, req: Request):
    body = req.body
    by_id = req.api_version >= 6
    names = [_name_for(state, t) for t in body.topics] if by_id else list(body.topic_names)
    result_class = DeleteTopicsResponse.DeletableTopicResult
    results = []
    for name in names:
        code = _delete_one(state, name)
        results.append(result_class(name=name, error_code=code, error_message=None))
    return DeleteTopicsResponse(version=req.api_version, throttle_time_ms=0, responses=results)


def _name_for(state: BrokerState, topic) -> str | None:
    if topic.name:
        return topic.name
    meta = state.store.topic_by_id(topic.topic_id)
    return meta.name if meta is not None else None


def _delete_one(state: BrokerState, name: str | None) -> int:
    if name is None:
        return ErrorCode.UNKNOWN_TOPIC_ID
    try:
        state.store.delete_topic(name)
    except errors.BrokerStorageError as exc:
        return storage_error_code(exc)
    return ErrorCode.NONE


# -- DescribeConfigs -----------------------------------------------------------------------------


async def handle_describe_configs(state: BrokerState, req: Request):
    results = [_describe_resource(state, resource) for resource in req.body.resources]
    return DescribeConfigsResponse(version=req.api_version, throttle_time_ms=0, results=results)


def _describe_resource(state: BrokerState, resource):
    result_class = DescribeConfigsResponse.DescribeConfigsResult
    common = {"resource_type": resource.resource_type, "resource_name": resource.resource_name}
    if resource.resource_type == RESOURCE_TOPIC:
        meta = state.store.topic(resource.resource_name)
        if meta is None:
            message = f"topic {resource.resource_name!r} does not exist"
            code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            return result_class(error_code=code, error_message=message, configs=[], **common)
        overrides = dict(meta.configs)
    elif resource.resource_type == RESOURCE_BROKER:
        overrides = {}
    else:
        message = f"resource_type={resource.resource_type} is not supported (topics: 2, brokers: 4)"
        return result_class(error_code=ErrorCode.INVALID_REQUEST, error_message=message, configs=[], **common)
    wanted = set(resource.configuration_keys or ())
    entries = _config_entries(state, overrides)
    configs = [entry for entry in entries if not wanted or entry.name in wanted]
    return result_class(error_code=0, error_message=None, configs=configs, **common)


def _config_entries(state: BrokerState, overrides: dict[str, str]) -> list:
    entry_class = DescribeConfigsResponse.DescribeConfigsResult.DescribeConfigsResourceResult
    cfg = state.config
    policy = dataclasses.replace(
        state.store.default_config, flush=cfg.flush, flush_interval_ms=cfg.flush_interval_ms
    )
    defaults = topic_defaults(policy)  # what the broker does (group commit included), not the log setting
    entries = []
    for name in sorted({*defaults, *overrides}):
        overridden = name in overrides
        entries.append(
            entry_class(
                name=name,
                value=str(overrides[name]) if overridden else defaults[name],
                read_only=False,
                config_source=CONFIG_SOURCE_TOPIC if overridden else CONFIG_SOURCE_DEFAULT,
                is_default=not overridden,
                is_sensitive=False,
                synonyms=[],
                config_type=CONFIG_TYPE_STRING,
                documentation=None,
            )
        )
    return entries

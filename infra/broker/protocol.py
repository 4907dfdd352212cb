"""The Kafka wire protocol as the broker speaks it: API registry, version profile, framing, codes.

Requests are decoded and responses encoded with the Apache Kafka JSON message schemas bundled in
kafka-python (pinned to >=3.0.12,<3.1 in pyproject.toml): `ReqCls.decode(payload, version=v,
header=True)` on the way in, `RespCls(..., version=v).with_header(...).encode(framed=True,
header=True)` on the way out. Flexible versions and tagged fields are handled by that layer.

This module owns which API versions the broker advertises (the "lean" profile proven with
kafka-python, aiokafka, faust and librdkafka; see the reference notes) and how an unsupported API
key or version is answered. It knows nothing about topics, logs or groups.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from kafka.protocol.admin import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)

from infra.broker.errors import MalformedRequestError


class ErrorCode(enum.IntEnum):
    """The Kafka error codes this broker answers with (names as in the Kafka protocol guide)."""

    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    MESSAGE_TOO_LARGE = 10
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REQUEST = 42
    INVALID_CONFIG = 40
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    KAFKA_STORAGE_ERROR = 56
    INVALID_RECORD = 87
    UNKNOWN_SERVER_ERROR = -1
    GROUP_ID_NOT_FOUND = 69
    UNKNOWN_TOPIC_ID = 100
    MEMBER_ID_REQUIRED = 79


# api_key -> (request class, response class)
APIS: dict[int, tuple[type, type]] = {
    req.API_KEY: (req, resp)
    for req, resp in (
        (ProduceRequest, ProduceResponse),
        (FetchRequest, FetchResponse),
        (ListOffsetsRequest, ListOffsetsResponse),
        (MetadataRequest, MetadataResponse),
        (OffsetCommitRequest, OffsetCommitResponse),
        (OffsetFetchRequest, OffsetFetchResponse),
        (FindCoordinatorRequest, FindCoordinatorResponse),
        (JoinGroupRequest, JoinGroupResponse),
        (HeartbeatRequest, HeartbeatResponse),
        (LeaveGroupRequest, LeaveGroupResponse),
        (SyncGroupRequest, SyncGroupResponse),
        (DescribeGroupsRequest, DescribeGroupsResponse),
        (ListGroupsRequest, ListGroupsResponse),
        (ApiVersionsRequest, ApiVersionsResponse),
        (CreateTopicsRequest, CreateTopicsResponse),
        (DeleteTopicsRequest, DeleteTopicsResponse),
        (InitProducerIdRequest, InitProducerIdResponse),
        (OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse),
        (AddPartitionsToTxnRequest, AddPartitionsToTxnResponse),
        (AddOffsetsToTxnRequest, AddOffsetsToTxnResponse),
        (EndTxnRequest, EndTxnResponse),
        (TxnOffsetCommitRequest, TxnOffsetCommitResponse),
        (DescribeConfigsRequest, DescribeConfigsResponse),
        (DescribeClusterRequest, DescribeClusterResponse),
    )
}

API_VERSIONS_KEY = ApiVersionsRequest.API_KEY

# The "lean" profile: below topic ids (Fetch <= 12, Metadata <= 9), no KIP-848, no batched
# FindCoordinator/OffsetFetch. kafka-python infers "broker 3.0" from it; aiokafka and faust pick
# their old versions inside it. Proven with every client stack in the reference notes (section A2).
LEAN_PROFILE: dict[int, tuple[int, int]] = {
    18: (0, 3),
    3: (0, 9),
    0: (3, 9),
    1: (4, 12),
    2: (1, 7),
    8: (2, 8),
    9: (1, 7),
    10: (0, 3),
    11: (2, 7),
    12: (0, 4),
    13: (0, 4),
    14: (0, 5),
    15: (0, 5),
    16: (0, 4),
    19: (2, 7),
    20: (1, 5),
    32: (1, 4),
    22: (0, 4),
    24: (0, 3),
    25: (0, 3),
    26: (0, 3),
    28: (0, 3),
    23: (2, 4),
    60: (0, 1),
}

_HEADER = struct.Struct(">hhi")


@dataclass(frozen=True)
class RequestHeader:
    """The fixed part of every request header, read before the body is decoded."""

    api_key: int
    api_version: int
    correlation_id: int


@dataclass
class Request:
    """A decoded request: header fields plus the kafka-python message object."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: object
    client_host: str = ""


def peek_header(payload: bytes | memoryview) -> RequestHeader:
    """Read api key, version and correlation id from a request payload (without its size prefix)."""
    if len(payload) < _HEADER.size:
        raise MalformedRequestError(f"request of {len(payload)} bytes is shorter than a request header")
    return RequestHeader(*_HEADER.unpack_from(payload, 0))


def is_supported(api_key: int, api_version: int, profile: dict[int, tuple[int, int]]) -> bool:
    """Whether `api_key` at `api_version` is inside the advertised profile."""
    low, high = profile.get(api_key, (0, -1))
    return api_key in APIS and low <= api_version <= high


def decode_request(payload: bytes | memoryview, header: RequestHeader) -> Request:
    """Decode a supported request; `MalformedRequestError` names the api and version on failure."""
    request_class = APIS[header.api_key][0]
    try:
        body = request_class.decode(memoryview(payload), version=header.api_version, header=True)
    except Exception as exc:  # the codec raises many types on garbage: all mean "malformed"
        raise MalformedRequestError(
            f"cannot decode {request_class.__name__} v{header.api_version} "
            f"(correlation_id={header.correlation_id}): {type(exc).__name__}: {exc}"
        ) from exc
    client_id = body.header.client_id if body.header is not None else None
    return Request(header.api_key, header.api_version, header.correlation_id, client_id, body)


def response_class(api_key: int) -> type:
    return APIS[api_key][1]


def encode_response(body, correlation_id: int) -> bytes:
    """Frame a response object (already built at its version) with its header and size prefix."""
    body.with_header(correlation_id=correlation_id)
    return body.encode(framed=True, header=True)


def api_versions_body(profile: dict[int, tuple[int, int]], version: int, error: int = ErrorCode.NONE):
    """The ApiVersions response body listing `profile`."""
    entry = ApiVersionsResponse.ApiVersion
    keys = [entry(api_key=k, min_version=lo, max_version=hi) for k, (lo, hi) in sorted(profile.items())]
    return ApiVersionsResponse(error_code=error, throttle_time_ms=0, api_keys=keys, version=version)


def unsupported_api_versions(profile: dict[int, tuple[int, int]], correlation_id: int) -> bytes:
    """KIP-511: an ApiVersions request at a version we do not know gets a v0 body with error 35."""
    return encode_response(api_versions_body(profile, 0, ErrorCode.UNSUPPORTED_VERSION), correlation_id)


def unsupported_version_response(header: RequestHeader) -> bytes | None:
    """An UNSUPPORTED_VERSION answer for a known API at a version outside the profile.

    Only possible when the response schema has a top-level error code at that version (and the
    schema knows the version at all); otherwise None, and the caller closes the connection, which
    is what Apache Kafka does for a request it cannot parse.
    """
    resp_class = APIS[header.api_key][1]
    if not 0 <= header.api_version <= resp_class.max_version:
        return None
    body = resp_class(version=header.api_version)
    if "error_code" not in _top_level_fields(resp_class, header.api_version):
        return None
    body.error_code = ErrorCode.UNSUPPORTED_VERSION
    return encode_response(body, header.correlation_id)


def _top_level_fields(message_class: type, version: int) -> set[str]:
    fields = message_class._struct.fields  # kafka-python keeps the schema fields by snake_case name
    return {name for name, field in fields.items() if field.for_version_q(version)}

"""Handlers for consumer groups and committed offsets: FindCoordinator, JoinGroup, SyncGroup,
Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups.

Membership lives in the `GroupCoordinator` (memory); committed offsets go to the store, which
makes them durable before the commit is acknowledged. This node coordinates every group.
"""

from __future__ import annotations

import logging

from kafka.protocol.admin import DescribeGroupsResponse, ListGroupsResponse
from kafka.protocol.consumer import (
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
    SyncGroupResponse,
)
from kafka.protocol.metadata import FindCoordinatorResponse

from infra.broker.group_state import GroupState, JoinRequest
from infra.broker.protocol import ErrorCode, Request
from infra.broker.state import BrokerState

log = logging.getLogger(__name__)


async def handle_find_coordinator(state: BrokerState, req: Request):
    response = FindCoordinatorResponse
    address = {"node_id": state.node_id, "host": state.advertised_host, "port": state.advertised_port}
    if req.api_version >= 4:
        coordinators = [
            response.Coordinator(key=key, error_code=0, error_message=None, **address)
            for key in req.body.coordinator_keys
        ]
        return response(version=req.api_version, throttle_time_ms=0, coordinators=coordinators)
    return response(version=req.api_version, throttle_time_ms=0, error_code=0, error_message=None, **address)


# -- membership ----------------------------------------------------------------------------------


async def handle_join_group(state: BrokerState, req: Request):
    body, version = req.body, req.api_version
    rebalance_timeout = body.rebalance_timeout_ms if version >= 1 else body.session_timeout_ms
    join = JoinRequest(
        group_id=body.group_id,
        member_id=body.member_id,
        client_id=req.client_id or "",
        client_host=req.client_host,
        protocol_type=body.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in body.protocols],
        session_timeout_ms=body.session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout if rebalance_timeout > 0 else body.session_timeout_ms,
        group_instance_id=getattr(body, "group_instance_id", None),
        requires_known_member_id=version >= 4,
    )
    result = await state.groups.join(join)
    member_class = JoinGroupResponse.JoinGroupResponseMember
    return JoinGroupResponse(
        version=version,
        throttle_time_ms=0,
        error_code=result.error,
        generation_id=result.generation,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        leader=result.leader,
        skip_assignment=False,
        member_id=result.member_id,
        members=[
            member_class(member_id=member_id, group_instance_id=instance_id, metadata=metadata)
            for member_id, instance_id, metadata in result.members
        ],
    )


async def handle_sync_group(state: BrokerState, req: Request):
    body = req.body
    assignments = {a.member_id: bytes(a.assignment) for a in body.assignments}
    result = await state.groups.sync(body.group_id, body.generation_id, body.member_id, assignments)
    return SyncGroupResponse(
        version=req.api_version,
        throttle_time_ms=0,
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )


async def handle_heartbeat(state: BrokerState, req: Request):
    body = req.body
    code = state.groups.heartbeat(body.group_id, body.generation_id, body.member_id)
    return HeartbeatResponse(version=req.api_version, throttle_time_ms=0, error_code=code)


async def handle_leave_group(state: BrokerState, req: Request):
    body, version = req.body, req.api_version
    identities = (
        [(body.member_id, None)]
        if version < 3
        else [(m.member_id, m.group_instance_id) for m in body.members]
    )
    codes = state.groups.leave(body.group_id, [member_id for member_id, _ in identities])
    if version < 3:
        return LeaveGroupResponse(version=version, throttle_time_ms=0, error_code=codes[body.member_id])
    member_class = LeaveGroupResponse.MemberResponse
    members = [
        member_class(member_id=member_id, group_instance_id=instance_id, error_code=codes[member_id])
        for member_id, instance_id in identities
    ]
    return LeaveGroupResponse(version=version, throttle_time_ms=0, error_code=0, members=members)


# -- committed offsets ---------------------------------------------------------------------------


async def handle_offset_commit(state: BrokerState, req: Request):
    body, version = req.body, req.api_version
    member_id = body.member_id if version >= 1 else ""
    generation = body.generation_id_or_member_epoch if version >= 1 else -1
    refusal = state.groups.commit_error(body.group_id, generation, member_id)
    codes = await _commit(state, body, version) if refusal is None else {}
    topic_class = OffsetCommitResponse.OffsetCommitResponseTopic
    partition_class = topic_class.OffsetCommitResponsePartition
    topics = [
        topic_class(
            name=t.name,
            partitions=[
                partition_class(
                    partition_index=p.partition_index,
                    error_code=refusal if refusal is not None else codes[(t.name, p.partition_index)],
                )
                for p in t.partitions
            ],
        )
        for t in body.topics
    ]
    return OffsetCommitResponse(version=version, throttle_time_ms=0, topics=topics)


async def _commit(state: BrokerState, body, version: int) -> dict[tuple[str, int], int]:
    """Store the offsets of known partitions; an error code per (topic, partition). Under `--flush
    always` the fsync joins the group commit's next round (as a produce's does) instead of blocking
    the event loop for the disk's latency; the answer waits for it either way."""
    codes, offsets = {}, {}
    for topic in body.topics:
        meta = state.store.topic(topic.name)
        for p in topic.partitions:
            key = (topic.name, p.partition_index)
            if meta is None or not 0 <= p.partition_index < meta.partitions:
                codes[key] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            epoch = p.committed_leader_epoch if version >= 6 else -1
            offsets[key] = (p.committed_offset, p.committed_metadata or "", epoch)
            codes[key] = ErrorCode.NONE
    if not offsets:
        return codes
    deferred = state.acks_wait_for_fsync
    state.store.commit_offsets(body.group_id, offsets, sync=not deferred)
    if deferred:
        try:
            await state.commit.durable([state.store.offsets_journal])
        except Exception as exc:  # nothing acknowledged that is not on disk
            log.error("offset commit of group %r not acknowledged, fsync failed: %s", body.group_id, exc)
            codes.update(dict.fromkeys(offsets, ErrorCode.KAFKA_STORAGE_ERROR))
    return codes


async def handle_offset_fetch(state: BrokerState, req: Request):
    body, version = req.body, req.api_version
    if version >= 8:
        groups = [_fetch_group_v8(state, group) for group in body.groups]
        return OffsetFetchResponse(version=version, throttle_time_ms=0, groups=groups)
    wanted = None if body.topics is None else [(t.name, list(t.partition_indexes)) for t in body.topics]
    topic_class = OffsetFetchResponse.OffsetFetchResponseTopic
    partition_class = topic_class.OffsetFetchResponsePartition
    topics = [
        topic_class(name=name, partitions=[partition_class(**row) for row in rows])
        for name, rows in _committed_rows(state, body.group_id, wanted)
    ]
    return OffsetFetchResponse(version=version, throttle_time_ms=0, error_code=0, topics=topics)


def _fetch_group_v8(state: BrokerState, group):
    group_class = OffsetFetchResponse.OffsetFetchResponseGroup
    topic_class = group_class.OffsetFetchResponseTopics
    partition_class = topic_class.OffsetFetchResponsePartitions
    wanted = None if group.topics is None else [(t.name, list(t.partition_indexes)) for t in group.topics]
    topics = [
        topic_class(name=name, partitions=[partition_class(**row) for row in rows])
        for name, rows in _committed_rows(state, group.group_id, wanted)
    ]
    return group_class(group_id=group.group_id, error_code=0, topics=topics)


def _committed_rows(state: BrokerState, group_id: str, wanted: list[tuple[str, list[int]]] | None):
    """[(topic, [partition row kwargs])]; `wanted=None` means every committed partition."""
    committed = state.store.committed(group_id)
    if wanted is None:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(committed):
            by_topic.setdefault(topic, []).append(partition)
        wanted = list(by_topic.items())
    result = []
    for topic, partitions in wanted:
        rows = []
        for partition in partitions:
            offset, metadata, epoch = committed.get((topic, partition), (-1, "", -1))
            rows.append(
                {
                    "partition_index": partition,
                    "committed_offset": offset,
                    "committed_leader_epoch": epoch,
                    "metadata": metadata,
                    "error_code": 0,
                }
            )
        result.append((topic, rows))
    return result


# -- ListGroups / DescribeGroups -----------------------------------------------------------------


async def handle_list_groups(state: BrokerState, req: Request):
    body, version = req.body, req.api_version
    states_filter = {s.lower() for s in (getattr(body, "states_filter", None) or [])}
    listed_class = ListGroupsResponse.ListedGroup
    groups = []
    for group_id, group_state, protocol_type in _all_groups(state):
        if states_filter and group_state.lower() not in states_filter:
            continue
        groups.append(
            listed_class(
                group_id=group_id, protocol_type=protocol_type, group_state=group_state, group_type="classic"
            )
        )
    return ListGroupsResponse(version=version, throttle_time_ms=0, error_code=0, groups=groups)


def _all_groups(state: BrokerState) -> list[tuple[str, str, str]]:
    """(group id, state name, protocol type) for live groups and groups known only by offsets."""
    rows = {
        group_id: (group.state.value, group.protocol_type or "")
        for group_id, group in state.groups.groups.items()
    }
    for group_id in state.store.groups_with_offsets():
        rows.setdefault(group_id, (GroupState.EMPTY.value, "consumer"))
    return [(group_id, *rows[group_id]) for group_id in sorted(rows, key=str)]


async def handle_describe_groups(state: BrokerState, req: Request):
    groups = [_describe_group(state, group_id) for group_id in req.body.groups]
    return DescribeGroupsResponse(version=req.api_version, throttle_time_ms=0, groups=groups)


def _describe_group(state: BrokerState, group_id: str):
    described_class = DescribeGroupsResponse.DescribedGroup
    member_class = described_class.DescribedGroupMember
    group = state.groups.describe(group_id)
    if group is None:
        known = group_id in set(state.store.groups_with_offsets())
        group_state = GroupState.EMPTY.value if known else GroupState.DEAD.value
        return described_class(
            error_code=0,
            group_id=group_id,
            group_state=group_state,
            protocol_type="consumer" if known else "",
            protocol_data="",
            members=[],
        )
    members = [
        member_class(
            member_id=m.member_id,
            group_instance_id=m.group_instance_id,
            client_id=m.client_id,
            client_host=m.client_host,
            member_metadata=m.metadata_for(group.protocol_name),
            member_assignment=m.assignment,
        )
        for m in group.members.values()
    ]
    return described_class(
        error_code=0,
        group_id=group_id,
        group_state=group.state.value,
        protocol_type=group.protocol_type or "",
        protocol_data=group.protocol_name or "",
        members=members,
    )

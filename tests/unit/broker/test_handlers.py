"""Request handlers against a real on-disk store, without sockets: the paths real clients rarely
take on their own (acks=0, response size limits, timestamp lookups, validate_only, the v8
OffsetFetch groups form, DeleteTopics, long-poll wake-up on append).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from kafka.protocol.admin import CreateTopicsRequest, DeleteTopicsRequest, DescribeConfigsRequest
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest, OffsetCommitRequest, OffsetFetchRequest
from kafka.protocol.producer import ProduceRequest

from infra.broker.handlers import HANDLERS
from infra.broker.protocol import LEAN_PROFILE, Request
from infra.broker.runner import open_store
from infra.broker.state import BrokerConfig, BrokerState
from tests.support.raw_client import record_batch


@pytest.fixture
def state(tmp_path):
    config = BrokerConfig(data_dir=tmp_path / "broker", flush="interval")  # no group-commit task here
    broker_state = BrokerState(config, open_store(config))
    yield broker_state
    broker_state.store.close()


def call(state: BrokerState, body):
    api_key = body.API_KEY
    assert LEAN_PROFILE[api_key][1] >= body.API_VERSION, "a version the broker advertises"
    request = Request(api_key, body.API_VERSION, 1, "test", body, "/127.0.0.1")
    return asyncio.run(HANDLERS[api_key](state, request))


def produce(state: BrokerState, topic: str, partition: int, batch: bytes, acks: int = -1):
    data = ProduceRequest.TopicProduceData(
        name=topic,
        partition_data=[ProduceRequest.TopicProduceData.PartitionProduceData(index=partition, records=batch)],
    )
    return call(
        state, ProduceRequest(transactional_id=None, acks=acks, timeout_ms=1000, topic_data=[data], version=7)
    )


def fetch_request(
    topic: str, partitions: list[int], max_bytes: int, partition_max_bytes: int, wait_ms: int = 0
):
    parts = [
        FetchRequest.FetchTopic.FetchPartition(
            partition=p, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
            partition_max_bytes=partition_max_bytes,
        )
        for p in partitions
    ]  # fmt: skip
    return FetchRequest(
        replica_id=-1, max_wait_ms=wait_ms, min_bytes=1, max_bytes=max_bytes, isolation_level=0,
        session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(topic=topic, partitions=parts)],
        forgotten_topics_data=[], rack_id="", version=11,
    )  # fmt: skip


def test_acks_zero_gets_no_response_but_is_stored(state):
    state.store.create_topic("quiet", 1, {})
    assert produce(state, "quiet", 0, record_batch([b"a"]), acks=0) is None
    assert state.store.log("quiet", 0).high_watermark == 1


def test_fetch_respects_response_and_partition_limits(state):
    state.store.create_topic("big", 2, {})
    batch = record_batch([b"x" * 1000])
    for partition in (0, 1):
        for _ in range(3):
            assert produce(state, "big", partition, batch).responses[0].partition_responses[0].error_code == 0
    whole = call(state, fetch_request("big", [0, 1], max_bytes=10**6, partition_max_bytes=10**6))
    sizes = [len(p.records) for p in whole.responses[0].partitions]
    assert sizes == [3 * len(batch)] * 2
    limited = call(state, fetch_request("big", [0, 1], max_bytes=10**6, partition_max_bytes=len(batch) + 10))
    assert [len(p.records) for p in limited.responses[0].partitions] == [len(batch)] * 2
    tiny = call(state, fetch_request("big", [0, 1], max_bytes=10, partition_max_bytes=10))
    records = [len(p.records or b"") for p in tiny.responses[0].partitions]
    assert records == [len(batch), 0], "the first batch always comes back; nothing past max_bytes"


def test_fetch_long_poll_wakes_on_append(state):
    state.store.create_topic("waiting", 1, {})

    async def scenario():
        request = Request(1, 11, 1, "t", fetch_request("waiting", [0], 10**6, 10**6, wait_ms=5000), "")
        started = time.monotonic()
        pending = asyncio.ensure_future(HANDLERS[1](state, request))
        await asyncio.sleep(0.1)
        assert not pending.done(), "no data yet: the fetch waits"
        late = record_batch([b"late"])
        state.store.log("waiting", 0).append(late)
        state.appended.notify({("waiting", 0): len(late)})
        response = await pending
        return response, time.monotonic() - started

    response, elapsed = asyncio.run(scenario())
    assert len(response.responses[0].partitions[0].records) > 0
    assert elapsed < 4, "answered on append, not at max_wait_ms"


def test_fetch_long_poll_waits_for_its_own_partitions_and_min_bytes(state):
    """An append elsewhere, or fewer bytes than `min_bytes`, does not answer a waiting fetch."""
    state.store.create_topic("watched", 2, {})
    state.store.create_topic("other", 1, {})

    def append(topic: str, partition: int, payload: bytes) -> None:
        batch = record_batch([payload])
        state.store.log(topic, partition).append(batch)
        state.appended.notify({(topic, partition): len(batch)})

    async def scenario():
        body = fetch_request("watched", [0, 1], 10**6, 10**6, wait_ms=5000)
        body.min_bytes = 500
        pending = asyncio.ensure_future(HANDLERS[1](state, Request(1, 11, 1, "t", body, "")))
        await asyncio.sleep(0.05)
        append("other", 0, b"x" * 1000)
        append("watched", 1, b"small")
        await asyncio.sleep(0.1)
        assert not pending.done(), "another topic's bytes, and too few of its own, keep it waiting"
        append("watched", 0, b"y" * 600)
        return await asyncio.wait_for(pending, 2)

    response = asyncio.run(scenario())
    assert [len(p.records or b"") > 0 for p in response.responses[0].partitions] == [True, True]


def test_list_offsets_by_timestamp(state):
    state.store.create_topic("timed", 1, {})
    log = state.store.log("timed", 0)
    log.append(record_batch([b"early"]))
    time.sleep(0.02)
    middle = int(time.time() * 1000)
    time.sleep(0.02)
    log.append(record_batch([b"late"]))

    def lookup(timestamp: int):
        partition = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=0, current_leader_epoch=-1, timestamp=timestamp
        )
        topic = ListOffsetsRequest.ListOffsetsTopic(name="timed", partitions=[partition])
        body = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[topic], version=5)
        return call(state, body).topics[0].partitions[0]

    assert (lookup(-2).offset, lookup(-1).offset) == (0, 2)
    assert lookup(middle).offset == 1
    assert lookup(int(time.time() * 1000) + 60_000).offset == -1


def test_create_validate_only_and_delete(state):
    topic = CreateTopicsRequest.CreatableTopic(
        name="planned", num_partitions=3, replication_factor=1, assignments=[], configs=[]
    )
    dry = call(state, CreateTopicsRequest(topics=[topic], timeout_ms=1000, validate_only=True, version=5))
    assert dry.topics[0].error_code == 0 and state.store.topic("planned") is None
    call(state, CreateTopicsRequest(topics=[topic], timeout_ms=1000, validate_only=False, version=5))
    assert state.store.topic("planned").partitions == 3
    bad = CreateTopicsRequest.CreatableTopic(
        name="replicated", num_partitions=1, replication_factor=3, assignments=[], configs=[]
    )
    refused = call(state, CreateTopicsRequest(topics=[bad], timeout_ms=1000, version=5))
    assert refused.topics[0].error_code == 38  # INVALID_REPLICATION_FACTOR
    deleted = call(state, DeleteTopicsRequest(topic_names=["planned", "never"], timeout_ms=1000, version=4))
    assert [r.error_code for r in deleted.responses] == [0, 3]
    assert state.store.topic("planned") is None


def test_describe_configs_unknown_topic(state):
    resource = DescribeConfigsRequest.DescribeConfigsResource(
        resource_type=2, resource_name="missing", configuration_keys=None
    )
    result = call(state, DescribeConfigsRequest(resources=[resource], include_synonyms=False, version=1))
    assert result.results[0].error_code == 3


def offset_commit(group: str, topic: str, partitions: list[tuple[int, int, str | None]]):
    """An OffsetCommit v8 of (partition, offset, metadata) rows, leader epoch 0, outside any generation."""
    partition = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition
    rows = [
        partition(partition_index=p, committed_offset=o, committed_leader_epoch=0, committed_metadata=m)
        for p, o, m in partitions
    ]
    return OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name=topic, partitions=rows)],
        version=8,
    )


def test_offset_commit_and_v8_groups_offset_fetch(state):
    state.store.create_topic("tracked", 2, {})
    commit = offset_commit("g8", "tracked", [(0, 5, "m"), (9, 1, None)])
    codes = [p.error_code for p in call(state, commit).topics[0].partitions]
    assert codes == [0, 3]
    wanted = OffsetFetchRequest.OffsetFetchRequestGroup(
        group_id="g8",
        topics=[
            OffsetFetchRequest.OffsetFetchRequestGroup.OffsetFetchRequestTopics(
                name="tracked", partition_indexes=[0, 1]
            )
        ],
    )
    body = OffsetFetchRequest(groups=[wanted], require_stable=False, version=8)
    request = Request(9, 8, 1, "t", body, "")
    response = asyncio.run(HANDLERS[9](state, request))
    rows = response.groups[0].topics[0].partitions
    assert [(r.partition_index, r.committed_offset, r.metadata) for r in rows] == [(0, 5, "m"), (1, -1, "")]


def test_batch_over_max_message_bytes_is_refused(state):
    state.store.create_topic("small", 1, {"max.message.bytes": "512"})
    response = produce(state, "small", 0, record_batch([b"y" * 2000]))
    assert response.responses[0].partition_responses[0].error_code == 10  # MESSAGE_TOO_LARGE
    assert state.store.log("small", 0).high_watermark == 0


def test_offset_commit_under_flush_always_is_answered_after_a_group_commit_round(tmp_path):
    config = BrokerConfig(data_dir=tmp_path / "broker", flush="always")
    state = BrokerState(config, open_store(config))
    state.store.create_topic("tracked", 1, {})
    commit = offset_commit("g", "tracked", [(0, 7, "")])
    flushed: list[bool] = []
    real_flush = state.store.flush_offsets
    state.store.offsets_journal.flush = lambda: flushed.append(state.store._offsets_dirty) or real_flush()

    async def commit_in_a_round():
        state.commit.start()
        try:
            return await HANDLERS[commit.API_KEY](state, Request(commit.API_KEY, 8, 1, "t", commit, ""))
        finally:
            await state.commit.close()

    try:
        response = asyncio.run(commit_in_a_round())
        assert [p.error_code for p in response.topics[0].partitions] == [0]
        assert flushed == [True], "the round fsynced the offsets line the commit wrote"
        assert state.store.committed("g") == {("tracked", 0): (7, "", 0)}
    finally:
        state.store.close()

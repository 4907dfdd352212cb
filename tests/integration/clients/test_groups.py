"""clients.kafka.groups against the real embedded broker: a group's offsets committed from outside
the group (the sink's rewind, the benchmark's skip to the end, the replay's start offsets) are where
its next member starts reading."""

from __future__ import annotations

from clients.kafka import ensure_topics, make_consumer, make_producer
from clients.kafka.consume import assign_from_committed
from clients.kafka.groups import commit_group_offsets, topic_offsets
from clients.kafka.ranges import iter_range, topic_partitions
from schemas.topics import AGENT_EVENTS, TOPICS

GROUP = "test-group-offsets"
RECORDS = 5


def _publish(bootstrap: str) -> int:
    """`RECORDS` records under one key (so one partition, in order); returns that partition."""
    producer = make_producer(bootstrap, "test-groups")
    try:
        sent = [producer.send(AGENT_EVENTS, key=b"t-1", value=f"{i}".encode()) for i in range(RECORDS)]
        partitions = {future.get(timeout=30).partition for future in sent}
        assert len(partitions) == 1
        return partitions.pop()
    finally:
        producer.close()


def _member_reads(bootstrap: str) -> list[int]:
    """The offsets a new member of `GROUP` reads on agent.events, starting at what the group committed."""
    consumer = make_consumer(bootstrap, "test-groups-member", GROUP)
    try:
        start = assign_from_committed(consumer, [AGENT_EVENTS])
        parts = topic_partitions(consumer, [AGENT_EVENTS])
        positions = {tp: start.get((tp.topic, tp.partition), 0) for tp in parts}
        return [r.offset for r in iter_range(consumer, parts, positions, timeout_s=30, strict=True)]
    finally:
        consumer.close()


def test_a_group_starts_where_its_offsets_were_committed_from_outside(broker):
    ensure_topics(broker.bootstrap, [TOPICS[AGENT_EVENTS]])
    partition = _publish(broker.bootstrap)
    ends = topic_offsets(broker.bootstrap, [AGENT_EVENTS], "end")
    beginnings = topic_offsets(broker.bootstrap, [AGENT_EVENTS], "beginning")
    assert ends[(AGENT_EVENTS, partition)] == RECORDS
    assert set(beginnings.values()) == {0} and beginnings.keys() == ends.keys()
    assert topic_offsets(broker.bootstrap, ["no.such.topic"], "end") == {}

    commit_group_offsets(broker.bootstrap, GROUP, {(AGENT_EVENTS, partition): 3})  # the replay's starts
    assert _member_reads(broker.bootstrap) == [3, 4]

    commit_group_offsets(broker.bootstrap, GROUP, ends)  # the benchmark's skip to the end
    assert _member_reads(broker.bootstrap) == []

    commit_group_offsets(broker.bootstrap, GROUP, beginnings)  # the sink's rewind
    assert _member_reads(broker.bootstrap) == list(range(RECORDS))
    commit_group_offsets(broker.bootstrap, GROUP, {})  # nothing to commit: no change, no error
    assert _member_reads(broker.bootstrap) == list(range(RECORDS))

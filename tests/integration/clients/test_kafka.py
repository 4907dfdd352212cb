"""clients.kafka against the real embedded broker: one factory with one set of limits, read-to-end."""

from __future__ import annotations

from clients.kafka import MAX_REQUEST_BYTES, broker_reachable, ensure_topics, make_producer, read_to_end
from schemas.topics import AGENT_EVENTS, TOPICS


def test_ensure_topics_is_idempotent_and_creates_the_registry(broker):
    first = ensure_topics(broker.bootstrap)
    assert set(first) == set(TOPICS)
    assert ensure_topics(broker.bootstrap) == []


def test_a_large_record_is_accepted_and_read_back_to_the_end_with_its_coordinates(broker):
    ensure_topics(broker.bootstrap, [TOPICS[AGENT_EVENTS]])
    producer = make_producer(broker.bootstrap, "test-clients")
    big = b"x" * (900 * 1024)  # a step with a large observation, under the topics' max.message.bytes
    assert len(big) < MAX_REQUEST_BYTES
    try:
        for i in range(3):
            producer.send(AGENT_EVENTS, key=b"t-1", value=f"{i}".encode()).get(timeout=30)
        producer.send(AGENT_EVENTS, key=b"t-1", value=big).get(timeout=60)
    finally:
        producer.close()
    records = read_to_end(broker.bootstrap, [AGENT_EVENTS], timeout_s=60)
    assert [r.value for r in records[:3]] == [b"0", b"1", b"2"]
    assert records[3].value == big
    assert len({r.partition for r in records}) == 1  # one key, one partition, in order
    assert [r.offset for r in records] == [0, 1, 2, 3]
    assert records[0].describe() == f"{AGENT_EVENTS}[{records[0].partition}]@0"


def test_a_record_over_the_topic_limit_fails_loudly(broker):
    import pytest
    from kafka.errors import MessageSizeTooLargeError

    ensure_topics(broker.bootstrap, [TOPICS[AGENT_EVENTS]])
    producer = make_producer(broker.bootstrap, "test-clients")
    try:
        with pytest.raises(MessageSizeTooLargeError):
            producer.send(AGENT_EVENTS, key=b"t-1", value=b"x" * (2 * 1024 * 1024)).get(timeout=30)
    finally:
        producer.close()
    assert read_to_end(broker.bootstrap, [AGENT_EVENTS], timeout_s=10) == []


def test_read_to_end_of_a_missing_topic_is_empty(broker):
    assert read_to_end(broker.bootstrap, ["no.such.topic"], timeout_s=5) == []


def test_broker_reachable_answers_true_for_the_broker_and_false_for_a_closed_port(broker):
    import asyncio
    import socket

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    assert asyncio.run(broker_reachable(broker.bootstrap)) is True
    assert asyncio.run(broker_reachable(closed, timeout_s=1.0)) is False

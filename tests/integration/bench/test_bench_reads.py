"""The bench lab's own reads of the embedded broker go through `clients.kafka.ranges`: a topic read
to its end offsets (every partition), a topic's record count, and the latencies joined from what
was read (record timestamps)."""

from __future__ import annotations

from clients.kafka import ensure_topics, make_consumer, make_producer
from infra.bench.streams import _count, _join_latencies, _read_all
from schemas.topics import TopicSpec


def test_read_all_reads_every_partition_to_its_end_and_count_agrees(shared_broker):
    bootstrap, topic = shared_broker.bootstrap, "bench-reads-test"
    ensure_topics(bootstrap, [TopicSpec(topic, (), partitions=3)])
    producer = make_producer(bootstrap, "tests-bench-reads")
    for i in range(7):
        producer.send(topic, key=f"lat-{i}".encode(), value=b"{}", partition=i % 3).get(10)
    producer.close()

    records = _read_all(bootstrap, topic)
    assert sorted(r.key for r in records) == [f"lat-{i}".encode() for i in range(7)]
    assert {r.partition for r in records} == {0, 1, 2} and all(r.timestamp_ms for r in records)
    consumer = make_consumer(bootstrap, "tests-bench-reads")
    try:
        assert _count(consumer, topic) == 7
        assert _count(consumer, "bench-reads-no-such-topic") == 0
    finally:
        consumer.close()


def test_join_latencies_pairs_steps_with_their_rule_rewards_by_record_timestamps(broker):
    import orjson

    producer = make_producer(broker.bootstrap, "tests-bench-reads")
    for i, (sent, judged) in enumerate([(1_000, 1_250), (2_000, 2_040)]):
        step = {"type": "step.recorded", "event_id": f"s{i}"}
        producer.send("agent.events", key=b"lat-t", value=orjson.dumps(step), timestamp_ms=sent).get(10)
        reward = orjson.dumps({"source_event_id": f"s{i}"})
        producer.send("reward.rule", key=b"lat-t", value=reward, timestamp_ms=judged).get(10)
    producer.send("reward.rule", key=b"other", value=b"{}", timestamp_ms=9_999).get(10)  # not a probe
    producer.close()
    assert sorted(_join_latencies(broker.bootstrap)) == [40.0, 250.0]

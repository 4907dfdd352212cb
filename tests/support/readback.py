"""Read a topic back with a real kafka-python consumer (tests of the producers package), through
`clients.kafka` like the product does."""

from __future__ import annotations

import time

import orjson

from clients.kafka import make_consumer, read_to_end


def read_topic(bootstrap: str, topic: str, min_records: int = 0, timeout_s: float = 30.0) -> list[dict]:
    """Every record of `topic` (all partitions, from the beginning) as dicts with `key`,
    `partition`, `offset` and the decoded `value`; waits until at least `min_records` exist."""
    deadline = time.monotonic() + timeout_s
    while count_records(bootstrap, topic) < min_records and time.monotonic() < deadline:
        time.sleep(0.2)
    return [
        {"key": r.key, "partition": r.partition, "offset": r.offset, "value": orjson.loads(r.value)}
        for r in read_to_end(bootstrap, [topic], timeout_s)
    ]


def count_records(bootstrap: str, topic: str) -> int:
    """How many records `topic` holds (sum of end offsets); 0 if it does not exist yet."""
    from kafka import TopicPartition

    consumer = make_consumer(bootstrap, "agentstream-test-readback")
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in partitions]
        return sum(consumer.end_offsets(tps).values()) if tps else 0
    finally:
        consumer.close()


def built_batches(bootstrap: str) -> list:
    """Every `batch.built` event on `training.batches`, decoded (the trainer's announcements)."""
    from schemas.codec import decode
    from schemas.topics import TRAINING_BATCHES

    events = [decode(r.value) for r in read_to_end(bootstrap, [TRAINING_BATCHES])]
    return [e for e in events if e.type == "batch.built"]

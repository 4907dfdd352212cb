"""Read a topic back with a real kafka-python consumer (tests of the producers package)."""

from __future__ import annotations

import time

import orjson


def read_topic(bootstrap: str, topic: str, min_records: int = 0, timeout_s: float = 30.0) -> list[dict]:
    """Every record of `topic` (all partitions, from the beginning) as dicts with `key`,
    `partition`, `offset` and the decoded `value`; waits until at least `min_records` exist."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            partitions = consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            ends = consumer.end_offsets(tps) if tps else {}
            if sum(ends.values()) >= min_records or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if not tps:
            return []
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for tp, batch in consumer.poll(timeout_ms=500).items():
                out.extend(
                    {
                        "key": r.key,
                        "partition": tp.partition,
                        "offset": r.offset,
                        "value": orjson.loads(r.value),
                    }
                    for r in batch
                )
        return out
    finally:
        consumer.close()


def count_records(bootstrap: str, topic: str) -> int:
    """How many records `topic` holds (sum of end offsets); 0 if it does not exist yet."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in partitions]
        return sum(consumer.end_offsets(tps).values()) if tps else 0
    finally:
        consumer.close()

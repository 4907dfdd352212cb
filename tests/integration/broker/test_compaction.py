"""Log compaction in the running broker, observed through real clients over TCP (issue 17).

- 100k updates over 100 keys shrink to one record per key; kafka-python and aiokafka reading from
  offset 0 see the latest value of each key with increasing, gapped offsets; a group's committed
  offset inside a removed range resumes at the next existing record; the idempotent producer keeps
  producing; a delete-policy topic beside it is untouched.
- a tombstone is served until delete.retention.ms has passed, then it is gone with its key.
- kill -9 while compaction runs and right after it: the restart recovers every acknowledged latest value.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.structs import OffsetAndMetadata

from infra.broker.records import iter_batches
from tests.support.broker import start_broker
from tests.support.processes import wait_for

pytestmark = pytest.mark.integration

INTERVAL = ["--log-cleaner-interval-ms", "200"]
SEGMENT_BYTES = 262_144


def create_topic(bootstrap: str, name: str, configs: dict[str, str]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, 1, 1, topic_configs=configs)])
    finally:
        admin.close()


def produce_updates(producer: KafkaProducer, topic: str, count: int, keys: int, start: int = 0) -> dict:
    """`count` acknowledged updates cycling over `keys` keys; returns {key: latest value}."""
    futures = [
        producer.send(topic, key=b"key-%03d" % (i % keys), value=b"v-%07d" % i, partition=0)
        for i in range(start, start + count)
    ]
    producer.flush()
    assert all(f.succeeded() for f in futures), "every update is acknowledged"
    return {b"key-%03d" % (i % keys): b"v-%07d" % i for i in range(start, start + count)}


def roll(producer: KafkaProducer, topic: str) -> int:
    """One record too big to share a segment: what came before is sealed, hence cleanable."""
    return (
        producer.send(topic, key=b"zz-roll", value=b"r" * (SEGMENT_BYTES - 1000), partition=0).get(30).offset
    )


def partition_dir(broker, topic: str) -> Path:
    return broker.data_dir / "broker" / f"{topic}-0"


def cleaned_up_to(broker, topic: str) -> int:
    path = partition_dir(broker, topic) / "cleaner.checkpoint"
    try:
        return json.loads(path.read_bytes())["clean_end"]
    except (FileNotFoundError, ValueError):
        return -1


def records_on_disk(directory: Path) -> int:
    return sum(h.record_count for p in directory.glob("*.log") for h, _ in iter_batches(p.read_bytes()))


def read_kafka_python(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    end, out = consumer.end_offsets([tp])[tp], []
    deadline = time.monotonic() + 60
    while consumer.position(tp) < end and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=200).values():
            out.extend((r.offset, r.key, r.value) for r in batch)
    consumer.close()
    return out


def read_aiokafka(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioTopicPartition

    async def scenario():
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tp = AioTopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end, out = (await consumer.end_offsets([tp]))[tp], []
            while await consumer.position(tp) < end:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    out.extend((r.offset, r.key, r.value) for r in batch)
            return out
        finally:
            await consumer.stop()

    return asyncio.run(asyncio.wait_for(scenario(), 60))


def latest_per_key(records) -> dict[bytes, bytes | None]:
    return {key: value for _, key, value in records}


def assert_compacted_view(records, expected: dict, roll_offset: int) -> None:
    offsets = [o for o, _, _ in records]
    assert offsets == sorted(set(offsets)), "offsets strictly increase"
    assert offsets[-1] == roll_offset and offsets[0] > 0, "the log starts at 0: the first records are gone"
    keyed = [key for _, key, _ in records if key != b"zz-roll"]
    assert len(keyed) == len(expected), (
        "one record per key (older roll markers may wait in the active segment)"
    )
    assert {k: v for k, v in latest_per_key(records).items() if k != b"zz-roll"} == expected


def test_100k_updates_shrink_to_one_record_per_key_for_every_client(tmp_path):
    broker = start_broker(tmp_path / "broker", extra_args=INTERVAL)
    try:
        create_topic(
            broker.bootstrap, "latest", {"cleanup.policy": "compact", "segment.bytes": str(SEGMENT_BYTES)}
        )
        create_topic(broker.bootstrap, "history", {"segment.bytes": "16384"})
        producer = KafkaProducer(
            bootstrap_servers=broker.bootstrap,
            linger_ms=50,
            batch_size=1 << 20,
            max_request_size=8 << 20,
            enable_idempotence=True,
            acks="all",
        )
        group = KafkaConsumer(
            bootstrap_servers=broker.bootstrap, group_id="resumer", enable_auto_commit=False
        )
        group.commit({TopicPartition("latest", 0): OffsetAndMetadata(5000, "", -1)})  # later compacted away
        group.close()
        produce_updates(producer, "history", 5000, 100)
        history_files = {p.name: p.read_bytes() for p in partition_dir(broker, "history").glob("*.log")}
        expected = produce_updates(producer, "latest", 100_000, 100)
        marker = roll(producer, "latest")
        wait_for(lambda: cleaned_up_to(broker, "latest") == marker, 30, what="compaction of 'latest'")

        assert records_on_disk(partition_dir(broker, "latest")) == 101, "100,001 records -> 101"
        assert_compacted_view(read_kafka_python(broker.bootstrap, "latest"), expected, marker)
        assert_compacted_view(read_aiokafka(broker.bootstrap, "latest"), expected, marker)

        resumer = KafkaConsumer(
            "latest", bootstrap_servers=broker.bootstrap, group_id="resumer", enable_auto_commit=False
        )
        first = wait_for(lambda: next(iter(resumer.poll(timeout_ms=500).values()), None), 30, what="resume")
        resumer.close()
        assert first[0].offset == min(o for o, _, _ in read_kafka_python(broker.bootstrap, "latest")) > 5000

        more = produce_updates(producer, "latest", 10, 100, start=100_000)  # same idempotent producer
        producer.close()
        now = latest_per_key(read_kafka_python(broker.bootstrap, "latest"))
        assert {k: now[k] for k in more} == more, "the idempotent producer went on after compaction"
        assert {
            p.name: p.read_bytes() for p in partition_dir(broker, "history").glob("*.log")
        } == history_files
        assert not (partition_dir(broker, "history") / "cleaner.checkpoint").exists()
        assert len(read_kafka_python(broker.bootstrap, "history")) == 5000, "delete policy: nothing removed"
        timings = re.findall(r"compacted latest-0 .* in ([0-9.]+)s", broker.proc.log_text())
        assert timings, "the broker logs each cleaning with its duration"
    finally:
        broker.stop()


def test_tombstone_is_served_until_delete_retention_then_gone(tmp_path):
    broker = start_broker(tmp_path / "broker", extra_args=INTERVAL)
    try:
        configs = {
            "cleanup.policy": "compact",
            "segment.bytes": str(SEGMENT_BYTES),
            "delete.retention.ms": "4000",
        }
        create_topic(broker.bootstrap, "profiles", configs)
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5)
        expected = produce_updates(producer, "profiles", 500, 10)
        deleted_at = time.time()
        producer.send("profiles", key=b"key-003", value=None, partition=0).get(30)
        marker = roll(producer, "profiles")
        producer.close()
        wait_for(lambda: cleaned_up_to(broker, "profiles") == marker, 30, what="first compaction")
        seen = latest_per_key(read_kafka_python(broker.bootstrap, "profiles"))
        assert time.time() < deleted_at + 4, "this check ran before delete.retention.ms passed"
        assert b"key-003" in seen and seen[b"key-003"] is None, "the tombstone is still served"
        assert len(seen) == 11

        def tombstone_gone():
            return b"key-003" not in latest_per_key(read_kafka_python(broker.bootstrap, "profiles"))

        wait_for(tombstone_gone, 30, interval_s=0.5, what="the tombstone to expire")
        assert time.time() >= deleted_at + 4, "not before delete.retention.ms"
        expected.pop(b"key-003")
        rest = latest_per_key(read_kafka_python(broker.bootstrap, "profiles"))
        assert {k: v for k, v in rest.items() if k != b"zz-roll"} == expected, "every other key is intact"
    finally:
        broker.stop()


def _kill_when(broker, condition, timeout_s: float) -> bool:
    """kill -9 the broker as soon as `condition()` holds (or at the timeout); whether it held."""
    deadline = time.monotonic() + timeout_s
    while not (held := condition()) and time.monotonic() < deadline:
        time.sleep(0.0005)
    broker.proc.kill9()
    return held


def _cleaning(directory: Path):
    return lambda: any(entry.name.endswith((".cleaned", ".swap")) for entry in os.scandir(directory))


def test_kill9_during_and_after_compaction_keeps_every_acknowledged_latest_value(tmp_path):
    broker = start_broker(tmp_path / "broker", extra_args=INTERVAL)
    configs = {"cleanup.policy": "compact", "segment.bytes": str(SEGMENT_BYTES)}
    expected: dict[bytes, bytes] = {}
    try:
        create_topic(broker.bootstrap, "state", configs)
        directory, kills = partition_dir(broker, "state"), []
        for round_, after in enumerate([False, False, True]):
            producer = KafkaProducer(
                bootstrap_servers=broker.bootstrap, acks="all", linger_ms=20, batch_size=1 << 20
            )
            expected |= produce_updates(producer, "state", 40_000, 100, start=round_ * 40_000)
            marker = roll(producer, "state")
            producer.close()
            if after:
                held = _kill_when(broker, lambda m=marker: cleaned_up_to(broker, "state") == m, timeout_s=30)
                assert held, "the third kill came after a finished compaction"
            else:  # while a cleaned segment is being written or swapped in
                held = _kill_when(broker, _cleaning(directory), timeout_s=10)
            kills.append(held)
            broker.restart()
            got = read_kafka_python(broker.bootstrap, "state")
            assert {k: v for k, v in latest_per_key(got).items() if k != b"zz-roll"} == expected
            assert got[-1][0] == marker, "nothing acknowledged after the last roll is lost either"
        wait_for(lambda: cleaned_up_to(broker, "state") == marker, 30, what="compaction after the restarts")
        leftovers = [
            p.name for p in partition_dir(broker, "state").iterdir() if p.suffix in (".cleaned", ".swap")
        ]
        assert leftovers == []
        assert_compacted_view(read_kafka_python(broker.bootstrap, "state"), expected, marker)
        assert_compacted_view(read_aiokafka(broker.bootstrap, "state"), expected, marker)
        empty = [
            h for p in directory.glob("*.log") for h, _ in iter_batches(p.read_bytes()) if not h.record_count
        ]
        assert empty, "earlier producers' superseded last batches stay as empty batches, read past by both"
        logging.getLogger(__name__).info("kills while a cleaned file existed: %s", kills[:2])
    finally:
        broker.stop()

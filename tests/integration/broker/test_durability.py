"""Durability and retention of the embedded broker, observed through real clients (issue 3).

- kill -9 while an acks=all producer sends: after a restart every acknowledged message is present
  exactly once, in order per partition; a torn final batch appended to the segment is truncated.
- retention deletes whole old segments and ListOffsets(earliest) moves accordingly.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from tests.support.broker import start_broker
from tests.support.processes import running, wait_for

pytestmark = pytest.mark.integration


def create_topic(bootstrap: str, name: str, partitions: int, configs: dict | None = None) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs or {})])
    finally:
        admin.close()


def read_partitions(bootstrap: str, topic: str, partitions: int) -> dict[int, list[tuple[int, bytes]]]:
    """Every (offset, value) of every partition, from the log start to the end."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    ends = consumer.end_offsets(tps)
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    deadline = time.monotonic() + 60
    while any(consumer.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
        for tp, batch in consumer.poll(timeout_ms=200).items():
            out[tp.partition].extend((r.offset, r.value) for r in batch)
    consumer.close()
    return out


def count_lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def read_acks(path: Path) -> list[tuple[int, int, int]]:
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:  # the producer may die mid-line
            rows.append(tuple(int(x) for x in parts))
    return rows


def end_offset(bootstrap: str, topic: str, partition: int, earliest: bool = False) -> int:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        tp = TopicPartition(topic, partition)
        offsets = consumer.beginning_offsets([tp]) if earliest else consumer.end_offsets([tp])
        return offsets[tp]
    finally:
        consumer.close()


def test_kill9_during_acks_all_keeps_every_acknowledged_message_once(broker, tmp_path):
    create_topic(broker.bootstrap, "durable", 2)
    acks = tmp_path / "acks.txt"
    args = [
        sys.executable,
        "-m",
        "tests.support.acks_producer",
        broker.bootstrap,
        "durable",
        str(acks),
    ]
    with running(args, tmp_path / "producer.log"):
        wait_for(lambda: count_lines(acks) >= 3000, 60, what="3000 acknowledged messages")
        broker.proc.kill9()  # mid-stream: the producer is still sending
        time.sleep(0.3)
    acknowledged = read_acks(acks)
    assert len(acknowledged) >= 3000
    broker.restart()

    log = read_partitions(broker.bootstrap, "durable", 2)
    by_position = {(p, offset): int(value) for p, rows in log.items() for offset, value in rows}
    for partition, offset, n in acknowledged:
        assert by_position.get((partition, offset)) == n, f"acknowledged {n} at {partition}/{offset}"
    values = [int(value) for rows in log.values() for _, value in rows]
    assert len(values) == len(set(values)), "no message stored twice"
    for partition, rows in log.items():
        numbers = [int(value) for _, value in rows]
        assert numbers == sorted(numbers), f"partition {partition} keeps the send order"

    _tear_and_recover(broker, "durable", log)


def test_kill9_after_an_acknowledged_offset_commit_keeps_the_offsets(broker):
    """OffsetCommit's fsync joins the group commit's round (not the event loop): once the client has
    its answer, the offsets survive a kill -9."""
    from kafka.structs import OffsetAndMetadata

    create_topic(broker.bootstrap, "tracked", 2)
    parts = [TopicPartition("tracked", 0), TopicPartition("tracked", 1)]
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="keeper", enable_auto_commit=False)
    consumer.assign(parts)
    for n in range(1, 21):  # commits of a running consumer, each acknowledged before the next
        consumer.commit({tp: OffsetAndMetadata(n * 10 + tp.partition, "", -1) for tp in parts})
    consumer.close()
    broker.restart(kill9=True)
    reader = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="keeper", enable_auto_commit=False)
    try:
        assert [reader.committed(tp) for tp in parts] == [200, 201]
    finally:
        reader.close()


def _tear_and_recover(broker, topic: str, before: dict[int, list[tuple[int, bytes]]]) -> None:
    """Append half a batch to partition 0's active segment, as a crash mid-write would leave."""
    broker.proc.kill9()
    segment = max((broker.data_dir / "broker" / f"{topic}-0").glob("*.log"), key=lambda p: int(p.stem))
    with segment.open("ab") as fh:
        fh.write(b"\x00\x00\x00\x00\x00\x00\x99\x99\x00\x00\x40\x00torn-batch-garbage")
    broker.restart()
    assert f"truncating {segment}" in broker.proc.log_text(), "recovery found and cut the torn batch"
    assert read_partitions(broker.bootstrap, topic, 2) == before, "the torn tail is gone, the rest intact"
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    metadata = producer.send(topic, value=b"after-crash", partition=0).get(timeout=10)
    producer.close()
    assert metadata.offset == len(before[0]), "appends continue right after the last whole batch"


def test_retention_deletes_whole_segments_and_moves_log_start(tmp_path):
    broker = start_broker(tmp_path / "broker", extra_args=["--retention-check-interval-ms", "200"])
    try:
        configs = {"segment.bytes": "2048", "retention.bytes": "4096", "retention.ms": "-1"}
        create_topic(broker.bootstrap, "short-lived", 1, configs)
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
        for i in range(200):
            producer.send("short-lived", value=b"%04d" % i + b"x" * 200).get(timeout=10)
        producer.close()
        partition_dir = broker.data_dir / "broker" / "short-lived-0"
        wait_for(
            lambda: end_offset(broker.bootstrap, "short-lived", 0, earliest=True) > 0, 20, what="retention"
        )
        earliest = end_offset(broker.bootstrap, "short-lived", 0, earliest=True)
        segments = sorted(int(p.stem) for p in partition_dir.glob("*.log"))
        assert segments[0] == earliest, "log start is the base offset of the oldest remaining segment"
        assert sum(p.stat().st_size for p in partition_dir.glob("*.log")) <= 4096 + 2048
        rows = read_partitions(broker.bootstrap, "short-lived", 1)[0]
        assert rows[0][0] == earliest and rows[-1][0] == 199
        assert [int(v[:4]) for _, v in rows] == list(range(earliest, 200)), "whole segments, nothing partial"
    finally:
        broker.stop()

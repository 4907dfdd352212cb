"""Corruption on disk as real clients see it (issue 34, item 11): a batch whose CRC does not verify
is never served, whether it was damaged before a clean shutdown, while the broker runs, or before a
kill -9; what the broker cuts is reported at ERROR with its offsets and kept under `corrupt/`."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AioTopicPartition
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import CorruptRecordError

from infra.broker.records import iter_batches
from tests.support.broker import start_broker

pytestmark = pytest.mark.integration

TOPIC = "corrupt-me"
BATCHES = 10


def produce_batches(bootstrap: str) -> None:
    """BATCHES batches of one record each (value b"v<i>"), each acknowledged before the next."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    try:
        for i in range(BATCHES):
            producer.send(TOPIC, b"v%d" % i + b"." * 200, partition=0).get(timeout=30)
    finally:
        producer.close()


def partition_dir(data_dir: Path) -> Path:
    return data_dir / "broker" / f"{TOPIC}-0"  # `agentstream broker` keeps its logs under broker/


def segment_of(data_dir: Path) -> Path:
    return sorted(partition_dir(data_dir).glob("*.log"))[-1]


def flip_inside_batch(segment: Path, n: int) -> None:
    """Flip one byte in the records of the n-th batch: only its CRC-32C can tell."""
    data, pos = segment.read_bytes(), 0
    for i, (header, _) in enumerate(iter_batches(data)):
        if i == n:
            with open(segment, "r+b") as fh:
                fh.seek(pos + header.size - 20)
                byte = fh.read(1)
                fh.seek(pos + header.size - 20)
                fh.write(bytes([byte[0] ^ 0x01]))
            return
        pos += header.size
    raise AssertionError(f"no batch {n} in {segment}")


def consume_kafka_python(bootstrap: str, seconds: float = 6.0) -> tuple[list[int], Exception | None]:
    """Offsets kafka-python reads from the start within `seconds`, and the error poll() raised."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, check_crcs=True)
    tp = TopicPartition(TOPIC, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    offsets, error, deadline = [], None, time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and len(offsets) < BATCHES:
            try:
                for records in consumer.poll(timeout_ms=300).values():
                    offsets.extend(r.offset for r in records)
            except CorruptRecordError as exc:
                error = exc
                break
    finally:
        consumer.close()
    return offsets, error


async def consume_aiokafka(bootstrap: str, seconds: float) -> list[int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, check_crcs=True)
    await consumer.start()
    tp = AioTopicPartition(TOPIC, 0)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    offsets, deadline = [], time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=300)).values():
                offsets.extend(r.offset for r in records)
    finally:
        await consumer.stop()
    return offsets


def error_lines(broker) -> list[str]:
    return [line for line in broker.proc.log_text().splitlines() if " ERROR " in line]


def test_bad_crc_at_the_tail_after_a_clean_shutdown_is_cut_and_never_served(tmp_path):
    broker = start_broker(tmp_path / "data")
    try:
        produce_batches(broker.bootstrap)
        broker.proc.stop()
        flip_inside_batch(segment_of(broker.data_dir), BATCHES - 1)
        broker.restart()
        offsets, error = consume_kafka_python(broker.bootstrap, seconds=4)
        assert error is None and offsets == list(range(BATCHES - 1))
        logged = [line for line in error_lines(broker) if f"{TOPIC}-0" in line]
        assert logged and "from offset 9" in logged[0], broker.proc.log_text()[-2000:]
        kept = list((partition_dir(broker.data_dir) / "corrupt").glob("*-9.bin"))
        assert len(kept) == 1 and str(kept[0]) in logged[0]
    finally:
        broker.stop()


def test_a_batch_damaged_while_running_gets_consumers_a_clean_error(tmp_path, caplog):
    broker = start_broker(tmp_path / "data")
    try:
        produce_batches(broker.bootstrap)
        flip_inside_batch(segment_of(broker.data_dir), 5)  # the broker's next read sees it
        offsets, error = consume_kafka_python(broker.bootstrap)
        assert offsets == [0, 1, 2, 3, 4]
        assert error is not None and "failed crc check" not in str(error), "the broker served it"
        with caplog.at_level(logging.WARNING, logger="aiokafka"):
            aio_offsets = asyncio.run(consume_aiokafka(broker.bootstrap, seconds=3))
        assert aio_offsets == [0, 1, 2, 3, 4], "aiokafka neither gets the damaged batch nor skips it"
        retries = [r for r in caplog.records if "Unexpected error while fetching" in r.getMessage()]
        assert retries, "aiokafka says why it makes no progress"
        assert len(retries) < 100, f"{len(retries)} fetches in 3 s: a busy loop"
        logged = [line for line in error_lines(broker) if "offset 5" in line]
        assert len(logged) == 1, "one ERROR line however often consumers retry"
    finally:
        broker.stop()


def test_bad_byte_mid_segment_after_kill9_keeps_the_records_after_it(tmp_path):
    broker = start_broker(tmp_path / "data")
    try:
        produce_batches(broker.bootstrap)
        broker.proc.kill9()
        flip_inside_batch(segment_of(broker.data_dir), 3)
        broker.restart()
        survivors = [o for o in range(BATCHES) if o != 3]
        offsets, error = consume_kafka_python(broker.bootstrap)
        assert error is None and offsets == survivors
        assert asyncio.run(consume_aiokafka(broker.bootstrap, seconds=2)) == survivors
        logged = [line for line in error_lines(broker) if "offsets 3..3 are corrupt" in line]
        assert len(logged) == 1, broker.proc.log_text()[-2000:]
        kept = partition_dir(broker.data_dir) / "corrupt" / f"{0:020d}-3.bin"
        assert kept.exists() and str(kept) in logged[0]
    finally:
        broker.stop()

"""Build v2 record batches with kafka-python's own builder, and decode what the log returns."""

from __future__ import annotations

import time

from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from infra.broker.records import iter_batches

NO_PRODUCER = (-1, -1, -1)


def make_batch(
    values: list[bytes],
    *,
    producer: tuple[int, int, int] = NO_PRODUCER,
    timestamp_ms: int | None = None,
    compression: int = 0,
) -> bytes:
    """One batch holding `values` (keys b"k<i>"); `producer` is (producer_id, epoch, base_sequence)."""
    producer_id, epoch, base_sequence = producer
    builder = DefaultRecordBatchBuilder(2, compression, False, producer_id, epoch, base_sequence, 1 << 30)
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    for i, value in enumerate(values):
        builder.append(i, ts, b"k%d" % i, value, [])
    return bytes(builder.build())


def values_of(data: bytes) -> list[tuple[int, bytes]]:
    """(offset, value) of every record in `data` (whole batches, as the log returns them)."""
    out = []
    for _, view in iter_batches(data):
        out.extend((r.offset, r.value) for r in DefaultRecordBatch(bytes(view)))
    return out


def base_offsets(data: bytes) -> list[int]:
    return [header.base_offset for header, _ in iter_batches(data)]


def read_all(partition_log, start: int | None = None, max_bytes: int = 1 << 30) -> list[tuple[int, bytes]]:
    """Every (offset, value) from `start` (default: log start) to the high watermark."""
    offset = partition_log.log_start_offset if start is None else start
    out: list[tuple[int, bytes]] = []
    while offset < partition_log.high_watermark:
        chunk = values_of(partition_log.read(offset, max_bytes))
        assert chunk, f"read({offset}) returned nothing below the high watermark"
        out.extend(chunk)
        offset = chunk[-1][0] + 1
    return out


def crash(partition_log) -> None:
    """Drop a log the way kill -9 would: close its files without flushing state or a clean marker."""
    for segment in partition_log._segments:
        segment.close()


def crash_store(store) -> None:
    """kill -9 for a whole BrokerStore: no clean markers, no final snapshots."""
    for partition_log in store._logs.values():
        crash(partition_log)
    store._offsets_fh.close()
    if store._dir_lock is not None:  # the OS releases a dead process's lock
        store._dir_lock.close()

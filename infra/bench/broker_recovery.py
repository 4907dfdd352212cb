"""Measure how long a partition log takes to recover after a crash (used by `agentstream bench broker`).

Owns only the measurement: fill a log with ~16 KiB batches, simulate kill -9 (no clean-shutdown
marker, a torn half batch at the end), time the reopen. It writes only under the directory it is
given (the caller removes it) and asserts nothing: figures are reported, not tested.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from infra.broker.log import PartitionLog
from infra.broker.log_config import LogConfig
from infra.broker.segment import BatchScan

BATCH_BYTES = 16 * 1024
BATCHES_PER_APPEND = 64  # one 1 MiB write per append call keeps the fill fast


def _template_batch() -> bytes:
    """One ~16 KiB v2 batch built by kafka-python, exactly as a producer sends it."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    value = os.urandom(1000)
    i = 0
    while builder.size() + 1100 < BATCH_BYTES:
        builder.append(i, int(time.time() * 1000), b"key-%d" % i, value, [])
        i += 1
    return bytes(builder.build())


def _drop_page_cache(directory: Path) -> bool:
    """Evict this log's files from the page cache (only ours: other processes keep theirs)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in directory.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def _crash(plog: PartitionLog) -> None:
    """Close the files the way kill -9 does: no flush of state, no clean-shutdown marker."""
    for segment in plog._segments:
        segment.close()


def _full_crc_scan(plog: PartitionLog) -> float:
    """Seconds to verify every batch of every segment (the worst case: no segment trusted)."""
    start = time.perf_counter()
    for segment in plog._segments:
        scan = BatchScan(segment.fd, 0, segment.size, segment.base, verify_crc=True)
        for _ in scan:
            pass
        if scan.problem is not None:
            raise RuntimeError(f"{segment.log_path}: {scan.problem}")
    return time.perf_counter() - start


def _timed_open(directory: Path, config: LogConfig) -> tuple[PartitionLog, float]:
    start = time.perf_counter()
    plog = PartitionLog(directory, config)
    return plog, time.perf_counter() - start


def _fill(plog: PartitionLog, blob: bytes, total_bytes: int) -> float:
    """Append `blob` until the log holds `total_bytes`, flush; the seconds it took."""
    start = time.perf_counter()
    while plog.size_bytes < total_bytes:
        plog.append(blob)
    plog.flush()
    return time.perf_counter() - start


def _reopen_three_ways(directory: Path, config: LogConfig, hw: int, written: int, batch: bytes):
    """Reopen a crashed log with a warm page cache, after a crash with a cold one (None where the
    cache cannot be dropped), and after a clean close; then a full CRC scan. Returns the four
    times and whether every reopen found every acknowledged batch."""
    warm, warm_s = _timed_open(directory, config)
    correct = warm.high_watermark == hw and warm.size_bytes == written
    _crash(warm)
    cold_cache = _drop_page_cache(directory)
    cold, cold_s = _timed_open(directory, config)
    correct = correct and cold.high_watermark == hw
    cold.close()
    clean, clean_s = _timed_open(directory, config)
    correct = correct and clean.high_watermark == hw and len(clean.read(hw - 1, 1)) == len(batch)
    full_scan_s = _full_crc_scan(clean)
    clean.close()
    return warm_s, cold_s if cold_cache else None, clean_s, full_scan_s, correct


def measure_recovery(data_dir: Path, total_bytes: int, segment_bytes: int | None = None) -> dict:
    """Fill `data_dir/recovery-0` with ~`total_bytes` of 16 KiB batches, crash, and time recovery.

    `segment_bytes` defaults to the broker default (64 MiB); every segment is CRC-verified at open
    (infra/broker/damage.py), so `clean_open_s` and the recovery times cover the whole log.
    Returns figures in seconds and MB/s (`recovery_*`: reopen after the crash, page cache warm and,
    where posix_fadvise exists, cold; `clean_open_s`: reopen after a clean close; `full_crc_scan_s`:
    verifying every segment, the worst case), plus `correct`: every acknowledged batch came back and
    only the torn tail was dropped.
    """
    directory = Path(data_dir) / "recovery-0"
    config = LogConfig(flush="interval", flush_interval_ms=10_000)
    if segment_bytes is not None:
        config.segment_bytes = segment_bytes
    batch = _template_batch()
    plog = PartitionLog(directory, config)
    fill_s = _fill(plog, batch * BATCHES_PER_APPEND, total_bytes)
    written, hw, segments = plog.size_bytes, plog.high_watermark, plog.segment_count
    last_segment = plog._segments[-1]
    _crash(plog)
    with open(last_segment.log_path, "ab") as fh:
        fh.write(batch[: len(batch) // 2])
    warm_s, cold_s, clean_s, full_scan_s, correct = _reopen_three_ways(directory, config, hw, written, batch)
    mb = written / 1e6
    return {
        "total_bytes": written,
        "batch_bytes": len(batch),
        "batches": written // len(batch),
        "records": hw,
        "segments": segments,
        "segment_bytes": config.segment_bytes,
        "scanned_bytes": written,
        "fill_s": round(fill_s, 3),
        "fill_mb_s": round(mb / fill_s, 1),
        "recovery_warm_s": round(warm_s, 3),
        "recovery_cold_s": round(cold_s, 3) if cold_s is not None else None,
        "clean_open_s": round(clean_s, 3),
        "recovery_mb_s": round(mb / warm_s, 1),
        "full_crc_scan_s": round(full_scan_s, 3),
        "full_crc_scan_mb_s": round(mb / full_scan_s, 1),
        "correct": correct,
    }

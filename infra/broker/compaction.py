"""Log compaction (cleanup.policy=compact): keep the latest record of each key in sealed segments.

Owns the cleaner of one partition: the offset map (key -> its latest offset) over the part of the
log written since the last cleaning, rewriting record batches with only the records that survive,
writing a cleaned group of segments crash-safely, finishing an interrupted swap when a partition
opens, and the checkpoint saying how far the log is clean. `PartitionLog` (log.py) says which
segments are cleanable and swaps them in under its lock; this module reads them through its own
file descriptors, without the lock, and never touches the active segment.

Offsets never change. A rewritten batch keeps its baseOffset, lastOffsetDelta, timestamps, producer
fields and attributes (Kafka does the same, so producer sequences stay valid and clients move past a
batch whose last records are gone); recordCount, batchLength and the CRC are recomputed. A batch
left without records is dropped, unless it is its producer's last batch: that one stays, empty,
like in Kafka. Batches that cannot be decoded (a codec this process lacks, control batches) are
kept as they are and their keys are ignored: less is removed, nothing wrong is.

Files in a partition directory:

- `<base:020d>.cleaned`: a cleaned group being written; deleted on open (the old segments are intact).
- `<base:020d>-<end:020d>.swap`: a complete, fsynced cleaned group replacing the segments whose base
  lies in [base, end). Renaming `.cleaned` to `.swap` is the commit point: on open the old segments
  of that range are deleted and the swap becomes `<base>.log` (its index is rebuilt).
- `cleaner.checkpoint`: JSON `{"clean_end": offset, "tombstone_due_ms": ms or null}`: offsets below
  clean_end are clean; a kept tombstone becomes removable at tombstone_due_ms. Losing it only costs
  a full re-cleaning.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import kafka.codec as codecs
from crc32c import crc32c

from clients.files import fsync_dir
from infra.broker.errors import BrokerStorageError
from infra.broker.records import (
    COMPRESSION_MASK,
    CONTROL_FLAG,
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LOG_APPEND_TIME_FLAG,
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
)
from infra.broker.segment import INDEX_SUFFIX, LOG_SUFFIX, SCAN_CHUNK, write_file_atomic

log = logging.getLogger(__name__)

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
CHECKPOINT_FILE = "cleaner.checkpoint"
MAX_RELATIVE_OFFSET = 2**31 - 1  # index entries hold offsets relative to the segment base as int32
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
# codec id -> (available, decode, encode), as in kafka-python's DefaultRecordBatch
_CODECS = {
    1: (codecs.has_gzip, codecs.gzip_decode, codecs.gzip_encode),
    2: (codecs.has_snappy, codecs.snappy_decode, codecs.snappy_encode),
    3: (codecs.has_lz4, codecs.lz4_decode, codecs.lz4_encode),
    4: (codecs.has_zstd, codecs.zstd_decode, codecs.zstd_encode),
}


@dataclass
class CleanStats:
    """What one cleaning of one partition did (for the log line and for tests)."""

    segments_before: int = 0
    segments_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    records_before: int = 0
    records_after: int = 0
    seconds: float = 0.0
    groups_skipped: int = 0  # retention or close changed the segments meanwhile


@dataclass
class _Pass:
    """Inputs of the cleaning pass: the offset map and each producer's last batch."""

    now_ms: int
    delete_retention_ms: int
    latest: dict[bytes, int] = field(default_factory=dict)
    producer_last: dict[int, int] = field(default_factory=dict)  # producer id -> base offset
    tombstone_due_ms: int | None = None


# --- records inside a batch ----------------------------------------------------------------------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Zigzag varint at `pos`: (value, position after it)."""
    shift = raw = 0
    while True:
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def split_records(data: bytes, count: int) -> list[tuple[int, int, int, int, bytes | None, bool]]:
    """The `count` records of an uncompressed records section.

    Each as (start, end, offset_delta, timestamp_delta, key, value_is_null); data[start:end] is the
    record's exact bytes (length prefix included), reusable as is in a batch with the same base.
    """
    out, pos = [], 0
    for _ in range(count):
        length, body = _varint(data, pos)
        end = body + length
        ts_delta, p = _varint(data, body + 1)  # after the attributes byte
        off_delta, p = _varint(data, p)
        key_len, p = _varint(data, p)
        key = None if key_len < 0 else data[p : p + key_len]
        value_len, _ = _varint(data, p + max(key_len, 0))
        out.append((pos, end, off_delta, ts_delta, key, value_len < 0))
        pos = end
    if pos != len(data):
        raise ValueError(f"records section: {len(data) - pos} bytes after {count} records")
    return out


def decode_batch(batch: bytes, fields: tuple) -> tuple[bytes, list] | None:
    """(records section uncompressed, its records) or None for a batch kept as is (control batch,
    codec not available here, or records that do not parse)."""
    attributes = fields[5]
    if attributes & CONTROL_FLAG:
        return None
    data = batch[HEADER_SIZE:]
    codec = attributes & COMPRESSION_MASK
    try:
        if codec:
            available, decode, _ = _CODECS[codec]
            if not available():
                return None
            data = bytes(decode(data))
        return data, split_records(data, fields[12])
    except (KeyError, IndexError, ValueError, OSError) as exc:
        log.warning("batch at offset %d cannot be decoded, kept as is: %s", fields[0], exc)
        return None


def rebuild_batch(batch: bytes, fields: tuple, data: bytes, kept: list) -> bytes:
    """`batch` with only the `kept` records (from `decode_batch`); offsets and header fields kept."""
    body = b"".join(data[r[0] : r[1]] for r in kept)
    codec = fields[5] & COMPRESSION_MASK
    if codec:
        body = bytes(_CODECS[codec][2](body))
    head = bytearray(batch[:HEADER_SIZE])
    _I32.pack_into(head, 8, HEADER_SIZE - LOG_OVERHEAD + len(body))
    _I32.pack_into(head, 57, len(kept))
    if kept and not fields[5] & LOG_APPEND_TIME_FLAG:
        _I64.pack_into(head, 35, fields[7] + max(r[3] for r in kept))
    _U32.pack_into(head, 17, crc32c(bytes(head[CRC_START:]) + body))
    return bytes(head) + body


# --- reading segments ----------------------------------------------------------------------------


def segment_batches(path: Path, size: int) -> Iterator[tuple[tuple, bytes]]:
    """(header fields, whole batch) of each batch in the first `size` bytes of a sealed segment."""
    with open(path, "rb", buffering=SCAN_CHUNK) as fh:
        pos = 0
        while pos < size:
            head = fh.read(HEADER_SIZE)
            if len(head) < HEADER_SIZE:
                raise BrokerStorageError(f"{path}: ends at byte {pos + len(head)}, expected {size}")
            fields = HEADER.unpack(head)
            if fields[1] < MIN_BATCH_LENGTH or pos + LOG_OVERHEAD + fields[1] > size:
                raise BrokerStorageError(f"{path}: batch length {fields[1]} at byte {pos}")
            yield fields, head + fh.read(LOG_OVERHEAD + fields[1] - HEADER_SIZE)
            pos += LOG_OVERHEAD + fields[1]


def _scan(segments: list, clean_end: int, plan: _Pass) -> int:
    """Fill `plan`: producers' last batches over every segment, the offset map over the dirty ones
    (offsets from `clean_end` on). Returns how many records the segments hold."""
    records = 0
    for seg in segments:
        dirty = seg.next_offset > clean_end
        for fields, batch in segment_batches(seg.log_path, seg.size):
            records += fields[12]
            if fields[9] >= 0:
                plan.producer_last[fields[9]] = fields[0]
            decoded = decode_batch(batch, fields) if dirty and fields[0] >= clean_end else None
            if decoded is not None:
                base, latest = fields[0], plan.latest
                for _, _, off_delta, _, key, _ in decoded[1]:
                    if key is not None:
                        latest[key] = base + off_delta
    return records


# --- cleaning ------------------------------------------------------------------------------------


def clean_batch(batch: bytes, fields: tuple, plan: _Pass) -> tuple[bytes | None, int]:
    """(the batch as it stays, or None when it goes; how many records stay)."""
    decoded = decode_batch(batch, fields)
    if decoded is None:
        return batch, fields[12]
    data, records = decoded
    base, latest, kept = fields[0], plan.latest, []
    stamp = fields[8] if fields[5] & LOG_APPEND_TIME_FLAG else None
    for record in records:
        _, _, off_delta, ts_delta, key, tombstone = record
        if key is not None and latest.get(key, -1) > base + off_delta:
            continue  # a later record of the same key exists
        if tombstone and key is not None:
            due = (fields[7] + ts_delta if stamp is None else stamp) + plan.delete_retention_ms
            if due <= plan.now_ms:
                continue  # delete.retention.ms has passed: the tombstone itself goes
            plan.tombstone_due_ms = due if plan.tombstone_due_ms is None else min(plan.tombstone_due_ms, due)
        kept.append(record)
    if len(kept) == len(records):
        return batch, len(kept)
    if not kept and plan.producer_last.get(fields[9], -2) != base:
        return None, 0
    return rebuild_batch(batch, fields, data, kept), len(kept)


def _write_group(segments: list, plan: _Pass, out, max_bytes: int, stats: CleanStats) -> tuple[list, bool]:
    """Clean `segments[0]` and as many following segments as surely fit in segment.bytes (what is
    written so far plus the next one's full size) into `out`, fsynced. Returns (the group, whether
    it differs from its one original segment)."""
    group: list = []
    changed = False
    for seg in segments:
        if group and (
            out.tell() + seg.size > max_bytes or seg.next_offset - group[0].base > MAX_RELATIVE_OFFSET
        ):
            break
        group.append(seg)
        for fields, batch in segment_batches(seg.log_path, seg.size):
            kept, count = clean_batch(batch, fields, plan)
            changed = changed or kept is not batch
            stats.records_after += count
            if kept is not None:
                out.write(kept)
    out.flush()
    os.fsync(out.fileno())
    stats.bytes_after += out.tell()
    return group, changed or len(group) > 1


# --- the cleaner of one partition ----------------------------------------------------------------


def compact_log(plog, now_ms: int | None = None) -> CleanStats | None:
    """Clean one `PartitionLog` if its config compacts and it has enough to clean; None otherwise.

    Enough: the dirty part (sealed segments written since the last cleaning) is at least
    min.cleanable.dirty.ratio of the cleanable bytes, or a kept tombstone has become removable.
    """
    cfg, directory = plog.config, plog.directory
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if not cfg.compact:
        return None
    segments = plog.cleanable_segments(now_ms)
    checkpoint = read_checkpoint(directory)
    clean_end = checkpoint.get("clean_end", 0)
    dirty = sum(s.size for s in segments if s.next_offset > clean_end)
    total = sum(s.size for s in segments)
    due = checkpoint.get("tombstone_due_ms")
    if not segments or not (
        (dirty and dirty >= cfg.min_cleanable_dirty_ratio * total) or (due is not None and due <= now_ms)
    ):
        return None
    started = time.monotonic()
    plan = _Pass(now_ms, cfg.delete_retention_ms)
    stats = CleanStats(segments_before=len(segments), bytes_before=total)
    stats.records_before = _scan(segments, clean_end, plan)
    done = 0
    while done < len(segments):
        done += _clean_group(plog, segments[done:], plan, stats)
    if not stats.groups_skipped:
        write_checkpoint(directory, segments[-1].next_offset, plan.tombstone_due_ms)
    stats.seconds = time.monotonic() - started
    log.info(
        "compacted %s up to offset %d: %d -> %d records, %d -> %d bytes, %d -> %d segments in %.2fs",
        directory.name,
        segments[-1].next_offset,
        stats.records_before,
        stats.records_after,
        stats.bytes_before,
        stats.bytes_after,
        stats.segments_before,
        stats.segments_after,
        stats.seconds,
    )
    return stats


def _clean_group(plog, segments: list, plan: _Pass, stats: CleanStats) -> int:
    """Clean the next group of `segments` and swap it in; returns how many segments it took."""
    cleaned = plog.directory / f"{segments[0].base:020d}{CLEANED_SUFFIX}"
    try:
        with open(cleaned, "wb") as out:
            group, changed = _write_group(segments, plan, out, plog.config.segment_bytes, stats)
        if changed and not plog.replace_segments(group, cleaned):
            stats.groups_skipped += 1
            stats.segments_after += len(group) - 1
        stats.segments_after += 1
    finally:
        cleaned.unlink(missing_ok=True)
    return len(group)


# --- swapping files in, crash-safely -------------------------------------------------------------


def install_swap(directory: Path, cleaned: Path, base: int, end: int) -> None:
    """Replace the segment files whose base lies in [base, end) by the fsynced file `cleaned`."""
    swap = directory / f"{base:020d}-{end:020d}{SWAP_SUFFIX}"
    os.replace(cleaned, swap)
    fsync_dir(directory)  # the commit point: from here on, a restart finishes the swap
    _complete_swap(directory, swap, base, end)


def _complete_swap(directory: Path, swap: Path, base: int, end: int) -> None:
    for path in directory.glob(f"*{LOG_SUFFIX}"):
        stem = path.name[: -len(LOG_SUFFIX)]
        if stem.isdigit() and base <= int(stem) < end:
            (directory / f"{stem}{INDEX_SUFFIX}").unlink(missing_ok=True)  # before its log: never stale
            if int(stem) != base:
                path.unlink()
    (directory / f"{base:020d}{INDEX_SUFFIX}").unlink(missing_ok=True)
    os.replace(swap, directory / f"{base:020d}{LOG_SUFFIX}")
    fsync_dir(directory)


def finish_swaps(directory: Path) -> None:
    """On open: drop unfinished cleaned files, finish committed swaps (see the module docstring)."""
    for path in directory.glob(f"*{CLEANED_SUFFIX}"):
        log.info("removing %s: a compaction stopped before its commit point", path)
        path.unlink()
    for path in sorted(directory.glob(f"*{SWAP_SUFFIX}")):
        base, _, end = path.name[: -len(SWAP_SUFFIX)].partition("-")
        if not (base.isdigit() and end.isdigit()):
            log.warning("ignoring %s: not a compaction swap file name", path)
            continue
        log.warning("finishing the compaction swap %s interrupted by a crash", path)
        _complete_swap(directory, path, int(base), int(end))


def read_checkpoint(directory: Path) -> dict:
    try:
        data = json.loads((directory / CHECKPOINT_FILE).read_bytes())
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        log.warning("%s: unreadable cleaner checkpoint (%s): the next cleaning starts over", directory, exc)
        return {}
    return data if isinstance(data, dict) else {}


def write_checkpoint(directory: Path, clean_end: int, tombstone_due_ms: int | None) -> None:
    data = json.dumps({"clean_end": clean_end, "tombstone_due_ms": tombstone_due_ms}).encode()
    write_file_atomic(directory / CHECKPOINT_FILE, data, sync=True)

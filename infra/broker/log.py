"""One partition's durable log: segment files of record batches, sparse index, recovery, retention.

Owns the on-disk layout of a partition directory and the idempotent-producer state of that partition.
It must not know about topics, groups or the network: the store (`infra.broker.store`) maps
(topic, partition) to a `PartitionLog`, the protocol layer turns its results into Kafka responses.

Layout of `<data>/<topic>-<partition>/`:

- `<base:020d>.log`: record batches back to back, exactly as produced except baseOffset (assigned
  here) and partitionLeaderEpoch (set to 0), which lie outside the CRC.
- `<base:020d>.index`: sparse index, one 16-byte entry (relative offset i32, byte position i32,
  max timestamp of every batch before that position i64) every `index_interval_bytes`. Written when
  a segment is sealed and on clean close; the active segment's index is rebuilt on crash recovery.
- `<offset:020d>.snapshot`: idempotent-producer state as of `offset` (JSON), written at each roll
  and on clean close, so reopening only rescans the batches after it.
- `.clean_shutdown`: present only between a clean `close()` and the next open.

Recovery: sealed segments were fsynced when rolled, so only the last segment is checked. Without
the clean-shutdown marker it is scanned batch by batch (length, magic, offset continuity, CRC-32C)
and truncated at the first torn or corrupt batch.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import threading
import time
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

from crc32c import crc32c

from infra.broker.errors import (
    BrokerStorageError,
    InvalidConfigError,
    InvalidProducerEpochError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
)
from infra.broker.records import (
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    iter_batches,
    next_sequence,
)

__all__ = [
    "AppendResult",
    "InvalidProducerEpochError",
    "LogConfig",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "PartitionLog",
]

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
SNAPSHOT_SUFFIX = ".snapshot"
CLEAN_MARKER = ".clean_shutdown"
INDEX_ENTRY = struct.Struct(">iiq")
SCAN_CHUNK = 8 << 20
PRODUCER_BATCHES_KEPT = 5  # Kafka keeps the last 5 batches per producer for duplicate detection
SNAPSHOTS_KEPT = 2
NO_TIMESTAMP = -1
_LEN_AT_8 = struct.Struct(">i")
_OFFSET_AND_LEN = struct.Struct(">qi")
_DELTA_AT_23 = struct.Struct(">i")
_BASE_OFFSET = struct.Struct(">q")
_EPOCH_AT_12 = struct.Struct(">i")


def _now_ms() -> int:
    return int(time.time() * 1000)


# --- configuration ---------------------------------------------------------------------------------


@dataclass
class LogConfig:
    """How a partition log rolls, retains and flushes. Defaults: 64 MiB segments, 7 days, fsync always."""

    segment_bytes: int = 64 * 1024 * 1024
    retention_ms: int = 7 * 24 * 3600 * 1000  # -1 = keep forever
    retention_bytes: int = -1  # -1 = no size limit
    flush: str = "always"  # "always": fsync before append returns; "interval": every flush_interval_ms
    flush_interval_ms: int = 1000
    index_interval_bytes: int = 4096

    def __post_init__(self) -> None:
        if self.flush not in ("always", "interval"):
            raise InvalidConfigError(f"flush: must be 'always' or 'interval' (got {self.flush!r})")
        if self.segment_bytes < 1:
            raise InvalidConfigError(f"segment.bytes: must be positive (got {self.segment_bytes})")
        if self.index_interval_bytes < 1:
            raise InvalidConfigError(
                f"index.interval.bytes: must be positive (got {self.index_interval_bytes})"
            )

    @classmethod
    def from_topic_config(cls, configs: dict[str, str], base: LogConfig | None = None) -> LogConfig:
        """Apply Kafka topic config keys over `base` (or the defaults).

        Keys read: segment.bytes, retention.ms, retention.bytes, index.interval.bytes, flush.messages,
        flush.ms. flush.messages=1 or flush.ms=0 mean fsync on every append ("always"); any other
        value of either means "interval" (flush.ms giving the interval). Other keys are ignored.

        >>> LogConfig.from_topic_config({"retention.ms": "-1", "flush.messages": "1"}).retention_ms
        -1
        """
        cfg = replace(base) if base is not None else cls()
        ints = {
            "segment.bytes": "segment_bytes",
            "retention.ms": "retention_ms",
            "retention.bytes": "retention_bytes",
            "index.interval.bytes": "index_interval_bytes",
        }
        for key, attr in ints.items():
            if key in configs:
                setattr(cfg, attr, _int_config(configs, key))
        messages = _int_config(configs, "flush.messages") if "flush.messages" in configs else None
        flush_ms = _int_config(configs, "flush.ms") if "flush.ms" in configs else None
        if messages == 1 or flush_ms == 0:
            cfg.flush = "always"
        elif messages is not None or flush_ms is not None:
            cfg.flush = "interval"
            if flush_ms is not None:
                cfg.flush_interval_ms = flush_ms
        cfg.__post_init__()
        return cfg


def _int_config(configs: dict[str, str], key: str) -> int:
    value = configs[key]
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidConfigError(f"{key}: must be an integer (got {value!r})") from None


@dataclass
class AppendResult:
    """Where an append landed. `log_append_time_ms` is -1 (topics use CreateTime, as Kafka reports)."""

    base_offset: int
    last_offset: int
    log_append_time_ms: int
    duplicate: bool


# --- batch scanning --------------------------------------------------------------------------------


class _ShortRead(Exception):
    pass


class _Scan:
    """Walk batches in `fd` from byte `start` to `end`, stopping at the first invalid one.

    Iterating yields `(position, header_tuple)` (fields as in `records.HEADER`). Afterwards
    `valid_end` is the byte after the last good batch and `problem` says why it stopped early
    (None when it reached `end` cleanly). Reads in large chunks so a full CRC scan runs near disk speed.
    """

    def __init__(self, fd: int, start: int, end: int, next_offset: int | None, verify_crc: bool):
        self.fd, self.start, self.end = fd, start, end
        self.next_offset, self.verify_crc = next_offset, verify_crc
        self.valid_end = start
        self.problem: str | None = None

    def __iter__(self):
        end, verify, unpack = self.end, self.verify_crc, HEADER.unpack_from
        buf, buf_pos = b"", self.start  # buf holds file bytes [buf_pos, buf_pos + len(buf))
        pos, expected = self.start, self.next_offset
        while pos < end:
            if end - pos < HEADER_SIZE:
                self.problem = f"{end - pos} trailing bytes, shorter than a batch header"
                return
            try:
                if pos + HEADER_SIZE > buf_pos + len(buf):
                    buf, buf_pos = self._refill(buf, buf_pos, pos, HEADER_SIZE)
            except _ShortRead as exc:
                self.problem = str(exc)
                return
            rel = pos - buf_pos
            fields = unpack(buf, rel)
            size = LOG_OVERHEAD + fields[1]
            problem = _header_problem(fields, expected, end - pos)
            if problem:
                self.problem = problem
                return
            if verify:
                if pos + size > buf_pos + len(buf):
                    try:
                        buf, buf_pos = self._refill(buf, buf_pos, pos, size)
                    except _ShortRead as exc:
                        self.problem = str(exc)
                        return
                    rel = 0
                if crc32c(memoryview(buf)[rel + CRC_START : rel + size]) != fields[4]:
                    self.problem = f"crc mismatch in batch at offset {fields[0]}"
                    return
            yield pos, fields
            expected = fields[0] + fields[6] + 1
            pos += size
            self.valid_end = pos

    def _refill(self, buf: bytes, buf_pos: int, pos: int, need: int) -> tuple[bytes, int]:
        keep = buf[pos - buf_pos :] if pos < buf_pos + len(buf) else b""
        want = max(SCAN_CHUNK, need) - len(keep)
        more = os.pread(self.fd, min(want, self.end - pos - len(keep)), pos + len(keep))
        if len(keep) + len(more) < need:  # the file is shorter than the size we were told
            raise _ShortRead(f"file ends at byte {pos + len(keep) + len(more)}")
        return keep + more, pos


def _header_problem(fields: tuple, expected: int | None, available: int) -> str | None:
    if fields[3] != MAGIC:
        return f"magic {fields[3]} at offset {fields[0]}"
    if fields[1] < MIN_BATCH_LENGTH or LOG_OVERHEAD + fields[1] > available:
        return f"batch length {fields[1]} at offset {fields[0]} with {available} bytes left"
    if fields[6] < 0:
        return f"negative lastOffsetDelta {fields[6]} at offset {fields[0]}"
    if expected is not None and fields[0] != expected:
        return f"base offset {fields[0]} where {expected} was expected"
    return None


# --- segments --------------------------------------------------------------------------------------


class _Segment:
    """One `.log` file plus its in-memory sparse index. Not thread-safe; PartitionLog locks."""

    def __init__(self, directory: Path, base: int):
        self.base = base
        self.log_path = directory / f"{base:020d}{LOG_SUFFIX}"
        self.index_path = directory / f"{base:020d}{INDEX_SUFFIX}"
        self.fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = os.fstat(self.fd).st_size
        self.next_offset = base
        self.max_timestamp = NO_TIMESTAMP
        self.idx_offset = array("q")  # absolute base offset of an indexed batch
        self.idx_pos = array("q")  # its byte position
        self.idx_ts = array("q")  # max timestamp of every batch before that position
        self.since_index = 0

    # index maintenance
    def note_batch(self, pos: int, base_offset: int, last_offset: int, max_ts: int, size: int, every: int):
        if self.since_index >= every:
            self.idx_offset.append(base_offset)
            self.idx_pos.append(pos)
            self.idx_ts.append(self.max_timestamp)
            self.since_index = 0
        self.since_index += size
        self.next_offset = last_offset + 1
        if max_ts > self.max_timestamp:
            self.max_timestamp = max_ts

    def reset_index(self) -> None:
        self.idx_offset, self.idx_pos, self.idx_ts = array("q"), array("q"), array("q")
        self.since_index = 0
        self.next_offset, self.max_timestamp = self.base, NO_TIMESTAMP

    def write_index(self, sync: bool) -> None:
        data = b"".join(
            INDEX_ENTRY.pack(o - self.base, p, t)
            for o, p, t in zip(self.idx_offset, self.idx_pos, self.idx_ts, strict=True)
        )
        write_file_atomic(self.index_path, data, sync)

    def load_index(self) -> bool:
        """Read the `.index` file; False when missing or inconsistent with the log file."""
        try:
            data = self.index_path.read_bytes()
        except FileNotFoundError:
            return False
        if len(data) % INDEX_ENTRY.size:
            return False
        self.reset_index()
        last_pos = -1
        for rel, pos, ts in INDEX_ENTRY.iter_unpack(data):
            if pos <= last_pos or pos >= self.size or rel < 0:
                self.reset_index()
                return False
            self.idx_offset.append(self.base + rel)
            self.idx_pos.append(pos)
            self.idx_ts.append(ts)
            last_pos = pos
        if self.idx_ts:
            self.max_timestamp = self.idx_ts[-1]
        return True

    def scan_from_last_index(self, verify_crc: bool) -> _Scan:
        """A scan from the last indexed batch to the end of the file (index state updated by caller)."""
        start = self.idx_pos[-1] if self.idx_pos else 0
        expected = self.idx_offset[-1] if self.idx_offset else self.base
        return _Scan(self.fd, start, self.size, expected, verify_crc)

    def position_before(self, offset: int) -> tuple[int, int]:
        """(byte position, base offset) of the last indexed batch starting at or before `offset`."""
        i = bisect_right(self.idx_offset, offset) - 1
        if i < 0:
            return 0, self.base
        return self.idx_pos[i], self.idx_offset[i]

    def locate(self, offset: int) -> int:
        """Byte position of the batch containing `offset` (which must lie in this segment)."""
        pos, _ = self.position_before(offset)
        while pos < self.size:
            head = os.pread(self.fd, 27, pos)
            base, length = _OFFSET_AND_LEN.unpack_from(head, 0)
            if base + _DELTA_AT_23.unpack_from(head, 23)[0] >= offset:
                return pos
            pos += LOG_OVERHEAD + length
        raise OffsetOutOfRangeError(f"offset {offset} not found in segment {self.log_path}")

    def read_batches(self, pos: int, max_bytes: int) -> tuple[bytes, int]:
        """Whole batches from `pos` up to `max_bytes` (at least one). Returns (data, next offset)."""
        want = min(max(max_bytes, LOG_OVERHEAD), self.size - pos)
        data = os.pread(self.fd, want, pos)
        cut, next_offset = 0, None
        while cut + LOG_OVERHEAD <= len(data):
            base, length = _OFFSET_AND_LEN.unpack_from(data, cut)
            if cut + LOG_OVERHEAD + length > len(data):
                break
            if cut + 27 <= len(data):
                next_offset = base + _DELTA_AT_23.unpack_from(data, cut + 23)[0] + 1
            cut += LOG_OVERHEAD + length
        if cut == 0:  # the first batch alone exceeds max_bytes: Kafka returns it anyway
            base, length = _OFFSET_AND_LEN.unpack_from(data, 0)
            data = os.pread(self.fd, LOG_OVERHEAD + length, pos)
            return data, base + _DELTA_AT_23.unpack_from(data, 23)[0] + 1
        return (data if cut == len(data) else data[:cut]), next_offset

    def timestamp_for_retention(self) -> int:
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return int(os.fstat(self.fd).st_mtime * 1000)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def remove_files(self) -> None:
        self.close()
        for path in (self.log_path, self.index_path):
            path.unlink(missing_ok=True)


def write_file_atomic(path: Path, data: bytes, sync: bool) -> None:
    """Replace `path` atomically (tmp + fsync + rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- idempotent producer state ---------------------------------------------------------------------


class _ProducerEntry:
    """Last epoch and up to 5 batches (base_seq, last_seq, base_offset, last_offset) of one producer id."""

    __slots__ = ("batches", "epoch", "last_timestamp")

    def __init__(self, epoch: int, batches=(), last_timestamp: int = NO_TIMESTAMP):
        self.epoch = epoch
        self.batches: deque[tuple[int, int, int, int]] = deque(batches, maxlen=PRODUCER_BATCHES_KEPT)
        self.last_timestamp = last_timestamp

    def copy(self) -> _ProducerEntry:
        return _ProducerEntry(self.epoch, self.batches, self.last_timestamp)

    def to_json(self) -> dict:
        return {"epoch": self.epoch, "batches": [list(b) for b in self.batches], "ts": self.last_timestamp}

    @classmethod
    def from_json(cls, data: dict) -> _ProducerEntry:
        return cls(data["epoch"], [tuple(b) for b in data["batches"]], data.get("ts", NO_TIMESTAMP))


def check_sequence(
    entry: _ProducerEntry | None, producer_id: int, epoch: int, base_seq: int, last_seq: int
) -> tuple[int, int] | None:
    """Validate one idempotent batch against its producer's state.

    Returns the original (base_offset, last_offset) when it duplicates one of the retained batches,
    None when it is the next batch in sequence. An unknown producer id is accepted at any sequence
    (as Kafka does: its earlier batches may have been removed by retention).
    """
    if entry is None:
        return None
    if epoch < entry.epoch:
        raise InvalidProducerEpochError(
            f"producer_epoch: {epoch} is older than {entry.epoch} for producer id {producer_id}"
        )
    if epoch > entry.epoch:
        if base_seq != 0:
            raise OutOfOrderSequenceError(
                f"base_sequence: {base_seq} for new epoch {epoch} of producer id {producer_id}, expected 0"
            )
        return None
    for b_first, b_last, b_base, b_lastoff in entry.batches:
        if b_first == base_seq and b_last == last_seq:
            return b_base, b_lastoff
    if not entry.batches:
        return None
    expected = next_sequence(entry.batches[-1][1])
    if base_seq != expected:
        raise OutOfOrderSequenceError(
            f"base_sequence: {base_seq} for producer id {producer_id} epoch {epoch}, expected {expected}"
        )
    return None


def _record_batch(
    producers: dict[int, _ProducerEntry], pid: int, epoch: int, seqs: tuple[int, int, int, int], ts: int
) -> None:
    entry = producers.get(pid)
    if entry is None or entry.epoch != epoch:
        entry = producers[pid] = _ProducerEntry(epoch)
    entry.batches.append(seqs)
    entry.last_timestamp = max(entry.last_timestamp, ts)


# --- the partition log -----------------------------------------------------------------------------


class PartitionLog:
    """A durable, append-only log of record batches for one partition. Thread-safe (one lock).

    Offsets: `log_start_offset` is the first offset still stored, `high_watermark` the next offset to
    be assigned (single node: everything appended is committed). `read` raises OffsetOutOfRangeError
    for an offset below `log_start_offset` or above `high_watermark` and returns b"" at it.
    """

    def __init__(self, directory: Path, config: LogConfig):
        self.directory = Path(directory)
        self.config = config
        self._lock = threading.RLock()
        self._segments: list[_Segment] = []
        self._bases: list[int] = []
        self._producers: dict[int, _ProducerEntry] = {}
        self._positions: dict[int, tuple[_Segment, int]] = {}  # next-fetch-offset -> (segment, byte)
        self._dirty = False
        self._last_flush_ms = _now_ms()
        self._closed = False
        self.directory.mkdir(parents=True, exist_ok=True)
        self._open()

    # -- public properties
    @property
    def log_start_offset(self) -> int:
        return self._segments[0].base

    @property
    def high_watermark(self) -> int:
        return self._segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    # -- opening and recovery
    def _open(self) -> None:
        marker = self.directory / CLEAN_MARKER
        clean = marker.exists()
        bases = sorted(int(p.name[: -len(LOG_SUFFIX)]) for p in self.directory.glob(f"*{LOG_SUFFIX}"))
        if not bases:
            bases = [0]
        for i, base in enumerate(bases):
            seg = _Segment(self.directory, base)
            self._segments.append(seg)
            self._bases.append(base)
            if i < len(bases) - 1:
                self._load_sealed(seg, bases[i + 1])
            else:
                self._load_active(seg, clean)
        self._rebuild_producers()
        if clean:
            marker.unlink()
            fsync_dir(self.directory)

    def _load_sealed(self, seg: _Segment, next_base: int) -> None:
        if not seg.load_index():
            log.info("rebuilding index of %s", seg.log_path)
            self._rebuild_index(seg, verify_crc=False)
            seg.write_index(sync=True)
        else:
            self._index_tail(seg, seg.scan_from_last_index(verify_crc=False), clean=True)
        if seg.next_offset != next_base:
            log.warning(
                "segment %s ends at offset %d but the next segment starts at %d",
                seg.log_path,
                seg.next_offset,
                next_base,
            )

    def _load_active(self, seg: _Segment, clean: bool) -> None:
        if clean and seg.load_index():
            scan = seg.scan_from_last_index(verify_crc=False)
            self._index_tail(seg, scan, clean=True)
            if scan.problem is None:
                return
            log.warning("clean-shutdown marker present but %s is inconsistent: full recovery", seg.log_path)
        self._rebuild_index(seg, verify_crc=True)

    def _rebuild_index(self, seg: _Segment, verify_crc: bool) -> None:
        """Scan the whole segment; truncate it at the first torn or corrupt batch."""
        seg.reset_index()
        scan = _Scan(seg.fd, 0, seg.size, seg.base, verify_crc)
        every = self.config.index_interval_bytes
        for pos, f in scan:
            seg.note_batch(pos, f[0], f[0] + f[6], f[8], LOG_OVERHEAD + f[1], every)
        if scan.problem is not None:
            self._truncate(seg, scan.valid_end, scan.problem)

    def _index_tail(self, seg: _Segment, scan: _Scan, clean: bool) -> None:
        """Continue the loaded index with the batches after its last entry (no new entries needed)."""
        every = self.config.index_interval_bytes
        seg.since_index = 0
        for pos, f in scan:
            seg.note_batch(pos, f[0], f[0] + f[6], f[8], LOG_OVERHEAD + f[1], every)
        if scan.problem is not None and not clean:
            self._truncate(seg, scan.valid_end, scan.problem)

    def _truncate(self, seg: _Segment, valid_end: int, problem: str) -> None:
        log.warning(
            "truncating %s at byte %d of %d (%d bytes dropped): %s",
            seg.log_path,
            valid_end,
            seg.size,
            seg.size - valid_end,
            problem,
        )
        os.ftruncate(seg.fd, valid_end)
        os.fsync(seg.fd)
        seg.size = valid_end

    # -- producer state
    def _rebuild_producers(self) -> None:
        hw = self.high_watermark
        start = self._load_snapshot(hw)
        if start >= hw:
            return
        seg_index = max(0, bisect_right(self._bases, start) - 1)
        for seg in self._segments[seg_index:]:
            pos, first = seg.position_before(max(start, seg.base))
            for _, f in _Scan(seg.fd, pos, seg.size, first, verify_crc=False):
                if f[9] >= 0 and f[11] >= 0 and f[0] >= start:
                    seqs = (f[11], next_sequence(f[11], f[6]), f[0], f[0] + f[6])
                    _record_batch(self._producers, f[9], f[10], seqs, f[8])

    def _snapshot_paths(self) -> list[tuple[int, Path]]:
        found = []
        for p in self.directory.glob(f"*{SNAPSHOT_SUFFIX}"):
            try:
                found.append((int(p.name[: -len(SNAPSHOT_SUFFIX)]), p))
            except ValueError:
                continue
        return sorted(found)

    def _load_snapshot(self, hw: int) -> int:
        """Load the newest usable producer snapshot; returns the offset it covers (log start if none)."""
        for offset, path in reversed(self._snapshot_paths()):
            if offset > hw or offset < self.log_start_offset:
                path.unlink(missing_ok=True)  # stale: the log was truncated below it, or retained away
                continue
            try:
                data = json.loads(path.read_bytes())
                self._producers = {int(k): _ProducerEntry.from_json(v) for k, v in data["producers"].items()}
                return offset
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring unreadable producer snapshot %s: %s", path, exc)
        self._producers = {}
        return self.log_start_offset

    def _write_snapshot(self, offset: int) -> None:
        data = {"offset": offset, "producers": {str(k): v.to_json() for k, v in self._producers.items()}}
        path = self.directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"
        write_file_atomic(path, json.dumps(data, separators=(",", ":")).encode(), sync=True)
        for _, old in self._snapshot_paths()[:-SNAPSHOTS_KEPT]:
            old.unlink(missing_ok=True)

    # -- append
    def append(self, records: bytes | bytearray | memoryview) -> AppendResult:
        """Append one or more v2 batches; returns the offsets assigned.

        Validates every batch (InvalidRecordError / CorruptRecordError) and idempotent-producer
        sequences (OutOfOrderSequenceError / InvalidProducerEpochError) before writing anything.
        A retry of one of a producer's last 5 batches returns its original offsets, duplicate=True.
        With flush="always" the data is fsynced before this returns.
        """
        batches = [
            (h.producer_id, h.producer_epoch, h.base_sequence, h.last_offset_delta, h.max_timestamp, h.size)
            for h, _ in iter_batches(records)
        ]
        if not batches:
            raise InvalidRecordError("records: empty, expected at least one record batch")
        with self._lock:
            self._check_open()
            pending: dict[int, _ProducerEntry] = {}
            offset = self.high_watermark
            for pid, epoch, base_seq, delta, _, _ in batches:
                if pid >= 0 and base_seq >= 0:
                    last_seq = next_sequence(base_seq, delta)
                    entry = pending.get(pid) or self._producers.get(pid)
                    dup = check_sequence(entry, pid, epoch, base_seq, last_seq)
                    if dup is not None:
                        return AppendResult(dup[0], dup[1], -1, True)
                    if pid not in pending:
                        pending[pid] = entry.copy() if entry is not None else _ProducerEntry(epoch)
                    _record_batch(pending, pid, epoch, (base_seq, last_seq, offset, offset + delta), 0)
                offset += delta + 1
            return self._write(records, batches, pending)

    def _write(self, records, batches: list[tuple], pending: dict[int, _ProducerEntry]) -> AppendResult:
        buf = bytearray(records)
        seg = self._segments[-1]
        if seg.size > 0 and seg.size + len(buf) > self.config.segment_bytes:
            seg = self._roll()
        first = offset = seg.next_offset
        pos = 0
        for *_, delta, _, size in batches:
            _BASE_OFFSET.pack_into(buf, pos, offset)
            _EPOCH_AT_12.pack_into(buf, pos + 12, 0)
            offset += delta + 1
            pos += size
        self._write_all(seg, buf)
        every, pos, offset = self.config.index_interval_bytes, seg.size, first
        for *_, delta, max_ts, size in batches:
            seg.note_batch(pos, offset, offset + delta, max_ts, size, every)
            offset += delta + 1
            pos += size
        seg.size = pos
        for pid, entry in pending.items():
            entry.last_timestamp = max(entry.last_timestamp, _now_ms())
            self._producers[pid] = entry
        self._dirty = True
        self._maybe_flush()
        return AppendResult(first, offset - 1, -1, False)

    def _write_all(self, seg: _Segment, buf: bytearray) -> None:
        view, done = memoryview(buf), 0
        try:
            while done < len(buf):
                done += os.write(seg.fd, view[done:])
        except OSError as exc:
            os.ftruncate(seg.fd, seg.size)  # never leave half a batch behind a failed append
            raise BrokerStorageError(f"append to {seg.log_path} failed: {exc}") from exc

    def _roll(self) -> _Segment:
        old = self._segments[-1]
        os.fsync(old.fd)
        old.write_index(sync=True)
        self._write_snapshot(old.next_offset)
        seg = _Segment(self.directory, old.next_offset)
        seg.next_offset = old.next_offset
        self._segments.append(seg)
        self._bases.append(seg.base)
        fsync_dir(self.directory)
        log.debug("rolled %s at offset %d", self.directory.name, seg.base)
        return seg

    def _maybe_flush(self) -> None:
        if self.config.flush == "always":
            os.fdatasync(self._segments[-1].fd)
            self._dirty = False
        elif _now_ms() - self._last_flush_ms >= self.config.flush_interval_ms:
            self._flush_locked()

    # -- read
    def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches starting with the one containing `offset`, up to `max_bytes` (but at least one
        batch when any exists at or after `offset`). Reads within one segment. b"" at the high watermark.
        """
        with self._lock:
            self._check_open()
            hw = self.high_watermark
            if offset == hw:
                return b""
            if offset < self.log_start_offset or offset > hw:
                raise OffsetOutOfRangeError(
                    f"offset: {offset} outside [{self.log_start_offset}, {hw}] of {self.directory.name}"
                )
            cached = self._positions.pop(offset, None)
            if cached is not None and cached[0].fd >= 0 and cached[1] < cached[0].size:
                seg, pos = cached
            else:
                seg = self._segments[bisect_right(self._bases, offset) - 1]
                pos = seg.locate(offset)
            data, next_offset = seg.read_batches(pos, max_bytes)
            if len(self._positions) > 256:
                self._positions.clear()
            if next_offset <= seg.next_offset:  # at the active end it becomes valid once data follows
                self._positions[next_offset] = (seg, pos + len(data))
            return data

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= `timestamp_ms`, None if none.

        Record-precise for batches kafka-python can decode; a batch it cannot decode answers with the
        batch's base offset and max timestamp.
        """
        with self._lock:
            self._check_open()
            for seg in self._segments:
                if seg.max_timestamp < timestamp_ms:
                    continue
                i = bisect_left(seg.idx_ts, timestamp_ms) - 1
                pos, first = (seg.idx_pos[i], seg.idx_offset[i]) if i >= 0 else (0, seg.base)
                for bpos, f in _Scan(seg.fd, pos, seg.size, first, verify_crc=False):
                    if f[8] >= timestamp_ms:
                        data = os.pread(seg.fd, LOG_OVERHEAD + f[1], bpos)
                        return _first_record_at(data, timestamp_ms, f[0], f[8])
            return None

    # -- retention, flushing, lifecycle
    def apply_retention(self, now_ms: int) -> int:
        """Delete whole old segments (never the active one) past retention.ms or retention.bytes."""
        cfg, deleted = self.config, 0
        with self._lock:
            self._check_open()
            total = self.size_bytes
            while len(self._segments) > 1:
                seg = self._segments[0]
                by_time = cfg.retention_ms >= 0 and seg.timestamp_for_retention() < now_ms - cfg.retention_ms
                by_size = cfg.retention_bytes >= 0 and total - seg.size >= cfg.retention_bytes
                if not (by_time or by_size):
                    break
                log.info(
                    "retention deletes %s (offsets %d-%d, %d bytes, by %s)",
                    seg.log_path,
                    seg.base,
                    seg.next_offset - 1,
                    seg.size,
                    "time" if by_time else "size",
                )
                seg.remove_files()
                self._segments.pop(0)
                self._bases.pop(0)
                total -= seg.size
                deleted += 1
            if deleted:
                self._positions.clear()
        return deleted

    def flush(self) -> None:
        """fsync the active segment if anything was appended since the last flush."""
        with self._lock:
            if not self._closed:
                self._flush_locked()

    def _flush_locked(self) -> None:
        if self._dirty:
            os.fdatasync(self._segments[-1].fd)
            self._dirty = False
        self._last_flush_ms = _now_ms()

    def close(self) -> None:
        """Flush, write the active index and producer snapshot, mark the shutdown clean."""
        with self._lock:
            if self._closed:
                return
            active = self._segments[-1]
            os.fsync(active.fd)
            active.write_index(sync=True)
            self._write_snapshot(self.high_watermark)
            (self.directory / CLEAN_MARKER).touch()
            fsync_dir(self.directory)
            self._close_fds()

    def delete(self) -> None:
        """Close and remove every file of this partition (DeleteTopics)."""
        with self._lock:
            if not self._closed:
                self._close_fds()
            shutil.rmtree(self.directory, ignore_errors=True)

    truncate_all = delete

    def _close_fds(self) -> None:
        for seg in self._segments:
            seg.close()
        self._positions.clear()
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise BrokerStorageError(f"partition log {self.directory} is closed")

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.directory.name}, start={self.log_start_offset}, "
            f"hw={self.high_watermark}, segments={len(self._segments)})"
        )


def _first_record_at(batch: bytes, timestamp_ms: int, base_offset: int, max_ts: int) -> tuple[int, int]:
    from kafka.record.default_records import DefaultRecordBatch

    try:
        for record in DefaultRecordBatch(batch):
            if record.timestamp >= timestamp_ms:
                return record.offset, record.timestamp
    except Exception as exc:  # e.g. a codec kafka-python lacks: answer with the batch
        log.debug("cannot decode batch at offset %d for a timestamp lookup: %s", base_offset, exc)
    return base_offset, max_ts

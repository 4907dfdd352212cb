"""One partition's durable log: segment files of record batches, sparse index, recovery, retention.

Owns the on-disk layout of a partition directory and the decisions over it: offset assignment,
when to roll, flush, recover and delete segments. Byte-level segment work is in `infra.broker.segment`,
the idempotent-producer rules in `infra.broker.producer_state`. It must not know about topics, groups
or the network: the store (`infra.broker.store`) maps (topic, partition) to a `PartitionLog`, the
protocol layer turns its results into Kafka responses.

Layout of `<data>/<topic>-<partition>/`:

- `<base:020d>.log`: record batches back to back, exactly as produced except baseOffset (assigned
  here) and partitionLeaderEpoch (set to 0), which lie outside the CRC.
- `<base:020d>.index`: sparse index, one 16-byte entry (relative offset i32, byte position i32,
  max timestamp of every batch before that position i64) every `index_interval_bytes`. Written when
  a segment is sealed and on clean close; the active segment's index is rebuilt on crash recovery.
- `<offset:020d>.snapshot`: idempotent-producer state as of `offset` (JSON), written at each roll
  and on clean close, so reopening only rescans the batches after it.
- `.clean_shutdown`: present only between a clean `close()` and the next open.
- `*.cleaned`, `*.swap`, `cleaner.checkpoint`: compaction's (`infra.broker.compaction`); its
  segments keep their offsets, with gaps, so reads skip to the next batch that exists.

Recovery: every segment is verified batch by batch at open, after a crash or a clean shutdown, and
indexed from what it holds; damage is kept aside, cut and reported (`infra.broker.damage`). Reads
verify each batch's CRC-32C again before serving it (StoredBatchCorruptError, never its bytes).
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import threading
import time
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from clients.files import fsync_dir
from infra.broker.compaction import finish_swaps, install_swap
from infra.broker.damage import CorruptReads, verify_segment
from infra.broker.errors import (
    BrokerStorageError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageIOError,
    StoredBatchCorruptError,
)
from infra.broker.log_config import LogConfig
from infra.broker.producer_state import (
    ProducerEntry,
    check_sequence,
    expire_producers,
    load_snapshot,
    record_batch,
    write_snapshot,
)
from infra.broker.records import (
    iter_batches,
    next_sequence,
    stamp_log_append_time,
)
from infra.broker.segment import LOG_SUFFIX, BatchScan, Segment, sync_copy

log = logging.getLogger(__name__)

CLEAN_MARKER = ".clean_shutdown"
MAX_OPEN_SEALED = 4  # sealed segments per partition keeping a file descriptor (LRU)
_BASE_OFFSET = struct.Struct(">q")
_EPOCH_AT_12 = struct.Struct(">i")
_fdatasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class AppendResult:
    """Where an append landed. `log_append_time_ms`: the broker's stamp on LogAppendTime topics, else -1."""

    base_offset: int
    last_offset: int
    log_append_time_ms: int
    duplicate: bool


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
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._producers: dict[int, ProducerEntry] = {}
        self._positions: dict[int, tuple[Segment, int]] = {}  # next-fetch-offset -> (segment, byte)
        self._open_sealed: OrderedDict[Segment, None] = OrderedDict()
        self._corrupt_reads = CorruptReads(self.directory.name)
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
        finish_swaps(self.directory)  # a compaction interrupted after its commit point
        names = (p.name[: -len(LOG_SUFFIX)] for p in self.directory.glob(f"*{LOG_SUFFIX}"))
        bases = sorted(int(name) for name in names if name.isdigit())
        if not bases:
            bases = [0]
        for i, base in enumerate(bases):
            seg = Segment(self.directory, base)
            self._segments.append(seg)
            self._bases.append(base)
            if i < len(bases) - 1:
                self._load_sealed(seg, bases[i + 1])
                seg.release()
            else:
                self._load(seg, clean)
        self._rebuild_producers()
        if clean:
            marker.unlink()
            fsync_dir(self.directory)

    def _load_sealed(self, seg: Segment, next_base: int) -> None:
        self._load(seg, clean=True)  # a sealed segment was fsynced when rolled: all of it is acked
        if seg.next_offset < next_base:  # compaction removed the segment's last batches
            seg.next_offset = next_base
        elif seg.next_offset > next_base:
            log.warning(
                "segment %s ends at offset %d but the next segment starts at %d",
                seg.log_path,
                seg.next_offset,
                next_base,
            )

    def _load(self, seg: Segment, clean: bool) -> None:
        """Verify every batch (infra.broker.damage) and index the segment from what it holds: the
        index file is never trusted, only checked, so a damaged one is reported and rewritten."""
        had_index = seg.index_path.exists()
        index_ok = seg.load_index()
        damaged = verify_segment(seg, self.config.index_interval_bytes, clean)
        if had_index and not index_ok:
            log.warning("index file %s is damaged: rebuilt from the log", seg.index_path)
        if not index_ok or damaged:
            seg.write_index(sync=True)

    # -- producer state
    def _rebuild_producers(self) -> None:
        hw = self.high_watermark
        start, self._producers = load_snapshot(self.directory, self.log_start_offset, hw)
        if start >= hw:
            return
        seg_index, now = max(0, bisect_right(self._bases, start) - 1), _now_ms()
        for seg in self._segments[seg_index:]:
            pos, first = seg.position_before(max(start, seg.base))
            self._use(seg)
            for _, f in BatchScan(seg.fd, pos, seg.size, first, verify_crc=False):
                if f[9] >= 0 and f[11] >= 0 and f[0] >= start:
                    seqs = (f[11], next_sequence(f[11], f[6]), f[0], f[0] + f[6])
                    record_batch(self._producers, f[9], f[10], seqs, now)  # expiry counts from now

    # -- append
    def append(self, records: bytes | bytearray | memoryview, *, sync: bool | None = None) -> AppendResult:
        """Append one or more v2 batches; returns the offsets assigned.

        Validates every batch (InvalidRecordError / CorruptRecordError) and idempotent-producer
        sequences (OutOfOrderSequenceError / InvalidProducerEpochError) before writing anything.
        A retry of one of a producer's last 5 batches returns its original offsets, duplicate=True.
        With flush="always" the data is fsynced before this returns. `sync=False` skips that fsync
        (the caller must call `flush()` before acknowledging, e.g. once for all partitions of a
        Produce request, possibly in a worker thread); `sync=True` forces it. Appended data is
        readable at once either way.
        """
        batches = [
            (h.producer_id, h.producer_epoch, h.base_sequence, h.last_offset_delta, h.max_timestamp, h.size)
            for h, _ in iter_batches(records)
        ]
        if not batches:
            raise InvalidRecordError("records: empty, expected at least one record batch")
        too_big = max(b[5] for b in batches)
        if too_big > self.config.max_message_bytes:
            raise RecordTooLargeError(
                f"record batch of {too_big} bytes exceeds max.message.bytes {self.config.max_message_bytes}"
            )
        with self._lock:
            self._check_open()
            pending: dict[int, ProducerEntry] = {}
            offset = self.high_watermark
            for pid, epoch, base_seq, delta, _, _ in batches:
                if pid >= 0 and base_seq >= 0:
                    last_seq = next_sequence(base_seq, delta)
                    entry = pending.get(pid) or self._producers.get(pid)
                    dup = check_sequence(entry, pid, epoch, base_seq, last_seq)
                    if dup is not None:
                        return AppendResult(dup[0], dup[1], -1, True)
                    if pid not in pending:
                        pending[pid] = entry.copy() if entry is not None else ProducerEntry(epoch)
                    record_batch(pending, pid, epoch, (base_seq, last_seq, offset, offset + delta), 0)
                offset += delta + 1
            try:
                return self._write(records, batches, pending, sync)
            except OSError as exc:  # disk full, I/O error: the client gets KAFKA_STORAGE_ERROR
                raise StorageIOError(f"append to {self.directory.name} failed: {exc}") from exc

    def _write(self, records, batches: list[tuple], pending: dict[int, ProducerEntry], sync) -> AppendResult:
        buf = bytearray(records)
        seg = self._segments[-1]
        if seg.size > 0 and seg.size + len(buf) > self.config.segment_bytes:
            seg = self._roll()
        first = offset = seg.next_offset
        pos = 0
        stamp = _now_ms() if self.config.timestamp_type == "LogAppendTime" else -1
        for *_, delta, _, size in batches:
            _BASE_OFFSET.pack_into(buf, pos, offset)
            _EPOCH_AT_12.pack_into(buf, pos + 12, 0)
            if stamp >= 0:
                stamp_log_append_time(buf, pos, size, stamp)
            offset += delta + 1
            pos += size
        self._write_all(seg, buf)
        every, pos, offset = self.config.index_interval_bytes, seg.size, first
        for *_, delta, max_ts, size in batches:
            seg.note_batch(pos, offset, offset + delta, max(max_ts, stamp), size, every)
            offset += delta + 1
            pos += size
        seg.size = pos
        for pid, entry in pending.items():
            entry.last_timestamp = max(entry.last_timestamp, _now_ms())
            self._producers[pid] = entry
        self._dirty = True
        self._maybe_flush(sync)
        return AppendResult(first, offset - 1, stamp, False)

    def _write_all(self, seg: Segment, buf: bytearray) -> None:
        view, done = memoryview(buf), 0
        try:
            while done < len(buf):
                done += os.write(seg.fd, view[done:])
        except OSError:
            os.ftruncate(seg.fd, seg.size)  # never leave half a batch behind a failed append
            raise

    def _roll(self) -> Segment:
        old = self._segments[-1]
        os.fsync(old.fd)
        old.write_index(sync=True)
        expire_producers(self._producers, _now_ms())
        write_snapshot(self.directory, self._producers, old.next_offset)
        old.release()
        seg = Segment(self.directory, old.next_offset)
        seg.next_offset = old.next_offset
        self._segments.append(seg)
        self._bases.append(seg.base)
        fsync_dir(self.directory)
        log.debug("rolled %s at offset %d", self.directory.name, seg.base)
        return seg

    def _maybe_flush(self, sync: bool | None) -> None:
        if sync is False:
            return
        if sync or self.config.flush == "always":
            _fdatasync(self._segments[-1].fd)
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
            if cached is not None and not cached[0].closed and cached[1] < cached[0].size:
                seg, pos = cached
                self._use(seg)
            elif (found := self._find(offset)) is not None:
                seg, pos = found
            else:
                return b""  # compaction left nothing between `offset` and the high watermark
            try:
                data, next_offset = seg.read_batches(pos, max_bytes)
            except StoredBatchCorruptError as exc:
                self._corrupt_reads.report(seg, pos, offset, exc)
                raise
            if len(self._positions) > 256:
                self._positions.clear()
            if next_offset <= seg.next_offset:  # at the active end it becomes valid once data follows
                self._positions[next_offset] = (seg, pos + len(data))
            return data

    def _find(self, offset: int) -> tuple[Segment, int] | None:
        """(segment, byte) of the first batch ending at or after `offset`, across compaction's gaps."""
        for seg in self._segments[bisect_right(self._bases, offset) - 1 :]:
            self._use(seg)
            pos = seg.locate(offset) if seg.size else None
            if pos is not None:
                return seg, pos
        return None

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= `timestamp_ms`, None if none.

        Record-precise for batches kafka-python can decode; a batch it cannot decode answers with the
        batch's base offset and max timestamp.
        """
        with self._lock:
            self._check_open()
            for seg in self._segments:
                if seg.max_timestamp >= timestamp_ms:
                    self._use(seg)
                    if (found := seg.first_at_or_after(timestamp_ms)) is not None:
                        return found
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
                self._open_sealed.pop(seg, None)
                self._segments.pop(0)
                self._bases.pop(0)
                total -= seg.size
                deleted += 1
            if deleted:
                self._positions.clear()
        return deleted

    # -- compaction (the cleaner is infra.broker.compaction; these are its two hooks)
    def cleanable_segments(self, now_ms: int) -> list[Segment]:
        """Sealed segments the cleaner may rewrite: every one but the active segment, up to the first
        holding a record younger than min.compaction.lag.ms. They are immutable while listed here."""
        with self._lock:
            self._check_open()
            lag, found = self.config.min_compaction_lag_ms, []
            for seg in self._segments[:-1]:
                if lag > 0 and seg.max_timestamp > now_ms - lag:
                    break
                found.append(seg)
            return found

    def replace_segments(self, old: list[Segment], cleaned: Path) -> bool:
        """Put the `cleaned` file in place of the consecutive sealed segments `old` (same offsets,
        fewer records). False, nothing changed, if retention or close changed `old` meanwhile."""
        with self._lock:
            i = next((n for n, seg in enumerate(self._segments) if seg is old[0]), -1)
            if self._closed or i < 0 or self._segments[i : i + len(old)] != old or old[-1].closed:
                return False
            end = old[-1].next_offset
            for seg in old:
                seg.close()
                self._open_sealed.pop(seg, None)
            install_swap(self.directory, cleaned, old[0].base, end)
            seg = Segment.cleaned(self.directory, old[0].base, end, self.config.index_interval_bytes)
            self._segments[i : i + len(old)] = [seg]
            self._bases[i : i + len(old)] = [seg.base]
            self._positions.clear()
            return True

    def flush(self) -> None:
        """fsync what was appended since the last flush. Safe to call from another thread: the lock
        is not held during the fsync, so appends and reads carry on meanwhile."""
        with self._lock:
            self._last_flush_ms = _now_ms()
            if self._closed or not self._dirty:
                return
            fd = os.dup(self._segments[-1].fd)  # survives a concurrent close or roll
            self._dirty = False
        sync_copy(fd, self._mark_dirty)

    def _mark_dirty(self) -> None:
        self._dirty = True

    def _flush_locked(self) -> None:
        if self._dirty:
            _fdatasync(self._segments[-1].fd)
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
            expire_producers(self._producers, _now_ms())
            write_snapshot(self.directory, self._producers, self.high_watermark)
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

    def _use(self, seg: Segment) -> None:
        """Mark a segment's descriptor as recently used; release the least recent sealed ones."""
        if seg is self._segments[-1]:
            return
        self._open_sealed[seg] = None
        self._open_sealed.move_to_end(seg)
        while len(self._open_sealed) > MAX_OPEN_SEALED:
            self._open_sealed.popitem(last=False)[0].release()

    def _close_fds(self) -> None:
        for seg in self._segments:
            seg.close()
        self._positions.clear()
        self._open_sealed.clear()
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise BrokerStorageError(f"partition log {self.directory} is closed")

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.directory.name}, start={self.log_start_offset}, "
            f"hw={self.high_watermark}, segments={len(self._segments)})"
        )

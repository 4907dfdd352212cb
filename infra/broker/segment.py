"""Segment files of a partition log: batch scanning, the sparse index, positional reads.

Owns the byte-level work on one `<base:020d>.log` file and its `<base:020d>.index`: walking batches
in large chunks (optionally verifying CRC-32C), the in-memory sparse index and its file format, and
finding and reading whole batches by offset. It does not decide when to roll, flush or delete
segments (that is `infra.broker.log.PartitionLog`) and knows nothing about producers or topics.

Index file: one 16-byte entry per `index_interval_bytes` of log: relative offset (i32), byte
position (i32), and the max timestamp of every batch before that position (i64).
"""

from __future__ import annotations

import logging
import os
import struct
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

from crc32c import crc32c

from infra.broker.errors import StoredBatchCorruptError
from infra.broker.records import (
    CRC_FIELD,
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    first_record_at,
)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
INDEX_ENTRY = struct.Struct(">iiq")
SCAN_CHUNK = 8 << 20
NO_TIMESTAMP = -1
MAX_SEGMENT_BYTES = 2**31 - 1  # index positions are int32, as in Kafka
OFFSET_AND_LEN = struct.Struct(">qi")
DELTA_AT_23 = struct.Struct(">i")
HEAD_PREFIX = struct.Struct(">qiibI")  # baseOffset, batchLength, leader epoch, magic, crc

log = logging.getLogger(__name__)


# --- batch scanning --------------------------------------------------------------------------------


class _ShortRead(Exception):
    pass


class BatchScan:
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
    if expected is not None and fields[0] < expected:  # a gap is legal: compaction drops whole batches
        return f"base offset {fields[0]} where at least {expected} was expected"
    return None


class Segment:
    """One `.log` file plus its in-memory sparse index. Not thread-safe; PartitionLog locks."""

    def __init__(self, directory: Path, base: int):
        self.base = base
        self.log_path = directory / f"{base:020d}{LOG_SUFFIX}"
        self.index_path = directory / f"{base:020d}{INDEX_SUFFIX}"
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.closed = False
        self.size = os.fstat(self._fd).st_size
        self.next_offset = base
        self.max_timestamp = NO_TIMESTAMP
        self.idx_offset = array("q")  # absolute base offset of an indexed batch
        self.idx_pos = array("q")  # its byte position
        self.idx_ts = array("q")  # max timestamp of every batch before that position
        self.since_index = 0

    @classmethod
    def cleaned(cls, directory: Path, base: int, end: int, every: int) -> Segment:
        """A sealed segment compaction just put in place for offsets [base, end): index rebuilt."""
        seg = cls(directory, base)
        seg.rebuild_index(every, verify_crc=False)
        seg.write_index(sync=True)
        seg.next_offset = end
        seg.release()
        return seg

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

    def rebuild_index(self, every: int, verify_crc: bool) -> None:
        """Index the whole file from scratch; truncate it at the first torn or corrupt batch."""
        self.reset_index()
        scan = self.index_scan(BatchScan(self.fd, 0, self.size, self.base, verify_crc), every)
        if scan.problem is not None:
            self.truncate(scan.valid_end, scan.problem)

    def index_scan(self, scan: BatchScan, every: int) -> BatchScan:
        """Note every batch `scan` yields in the index; returns the finished scan."""
        for pos, f in scan:
            self.note_batch(pos, f[0], f[0] + f[6], f[8], LOG_OVERHEAD + f[1], every)
        return scan

    def truncate(self, valid_end: int, problem: str) -> None:
        log.warning(
            "truncating %s at byte %d of %d (%d bytes dropped): %s",
            self.log_path,
            valid_end,
            self.size,
            self.size - valid_end,
            problem,
        )
        os.ftruncate(self.fd, valid_end)
        os.fsync(self.fd)
        self.size = valid_end

    def position_before(self, offset: int) -> tuple[int, int]:
        """(byte position, base offset) of the last indexed batch starting at or before `offset`."""
        i = bisect_right(self.idx_offset, offset) - 1
        if i < 0:
            return 0, self.base
        return self.idx_pos[i], self.idx_offset[i]

    def locate(self, offset: int) -> int | None:
        """Byte position of the first batch whose last offset is >= `offset`; None when no batch of
        this segment reaches it (compaction may have removed the segment's last batches)."""
        pos, _ = self.position_before(offset)
        while pos < self.size:
            head = os.pread(self.fd, 27, pos)
            if len(head) < 27:  # the file shrank since it was verified at load
                raise self._corrupt(pos, -1, f"{len(head)} bytes left, shorter than a batch header")
            base, length = OFFSET_AND_LEN.unpack_from(head, 0)
            if length < MIN_BATCH_LENGTH:  # damaged since it was verified at load
                raise self._corrupt(pos, base, f"batch length {length}")
            if base + DELTA_AT_23.unpack_from(head, 23)[0] >= offset:
                return pos
            pos += LOG_OVERHEAD + length
        return None

    def first_at_or_after(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= `timestamp_ms` here, else None."""
        i = bisect_left(self.idx_ts, timestamp_ms) - 1
        pos, first = (self.idx_pos[i], self.idx_offset[i]) if i >= 0 else (0, self.base)
        for bpos, f in BatchScan(self.fd, pos, self.size, first, verify_crc=False):
            if f[8] >= timestamp_ms:
                data = os.pread(self.fd, LOG_OVERHEAD + f[1], bpos)
                return first_record_at(data, timestamp_ms, f[0], f[8])
        return None

    def read_batches(self, pos: int, max_bytes: int) -> tuple[bytes, int]:
        """Whole batches from `pos` up to `max_bytes` (at least one). Returns (data, next offset).

        Every batch's CRC-32C is checked before it is returned (the bytes are in memory already,
        so it costs a pass of crc32c, no copy): the batches before a corrupt one are returned, a
        corrupt first batch raises StoredBatchCorruptError. A corrupt batch is never served."""
        want = min(max(max_bytes, LOG_OVERHEAD), self.size - pos)
        data = os.pread(self.fd, want, pos)
        view, size, prefix = memoryview(data), len(data), HEAD_PREFIX.unpack_from
        cut = last = 0
        while cut + CRC_START <= size:  # one unpack and one crc32c call per batch: the hot path
            _, length, _, _, crc = prefix(data, cut)
            end = cut + LOG_OVERHEAD + length
            if end > size or length < MIN_BATCH_LENGTH or crc32c(view[cut + CRC_START : end]) != crc:
                break
            last, cut = cut, end
        if cut == 0:  # the first batch alone exceeds max_bytes (Kafka returns it anyway), or is corrupt
            return self._first_batch(pos, data)
        base = OFFSET_AND_LEN.unpack_from(data, last)[0]
        next_offset = base + DELTA_AT_23.unpack_from(data, last + 23)[0] + 1
        return (data if cut == size else data[:cut]), next_offset

    def _first_batch(self, pos: int, head: bytes) -> tuple[bytes, int]:
        base, length = OFFSET_AND_LEN.unpack_from(head, 0)
        if length < MIN_BATCH_LENGTH or pos + LOG_OVERHEAD + length > self.size:
            raise self._corrupt(pos, base, f"batch length {length} with {self.size - pos} bytes left")
        data = head if LOG_OVERHEAD + length <= len(head) else os.pread(self.fd, LOG_OVERHEAD + length, pos)
        data = data[: LOG_OVERHEAD + length]
        if not _crc_ok(data, 0, len(data)):
            raise self._corrupt(pos, base, "its CRC-32C does not match its bytes")
        return data, base + DELTA_AT_23.unpack_from(data, 23)[0] + 1

    def _corrupt(self, pos: int, base: int, why: str) -> StoredBatchCorruptError:
        return StoredBatchCorruptError(
            f"batch at byte {pos} of {self.log_path.name} (base offset {base} by its header): {why}"
        )

    def timestamp_for_retention(self) -> int:
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return int(self.log_path.stat().st_mtime * 1000)

    @property
    def fd(self) -> int:
        """The file descriptor, reopened on demand after `release()` (sealed segments)."""
        if self._fd < 0:
            if self.closed:
                raise OSError(f"segment {self.log_path} is closed")
            self._fd = os.open(self.log_path, os.O_RDWR | os.O_APPEND)
        return self._fd

    def release(self) -> None:
        """Close the descriptor but stay usable: many sealed segments must not exhaust `ulimit -n`."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        self.release()
        self.closed = True

    def remove_files(self) -> None:
        self.close()
        for path in (self.log_path, self.index_path):
            path.unlink(missing_ok=True)


def _crc_ok(data: bytes, start: int, end: int) -> bool:
    return crc32c(memoryview(data)[start + CRC_START : end]) == CRC_FIELD.unpack_from(data, start + 17)[0]


def write_file_atomic(path: Path, data: bytes, sync: bool) -> None:
    """Replace `path` atomically (tmp + fsync + rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def sync_copy(fd_copy: int, on_failure) -> None:
    """fdatasync a descriptor duplicated under the caller's lock (so a concurrent close, roll or
    compaction cannot take it away while the lock is released for the disk), then close it;
    `on_failure()` marks the data unsynced again before an error propagates."""
    try:
        getattr(os, "fdatasync", os.fsync)(fd_copy)  # macOS has no fdatasync
    except OSError:
        on_failure()
        raise
    finally:
        os.close(fd_copy)

"""The durable local spool: an append-only, fsynced write-ahead log of encoded events on local disk.

Every event the SDK records passes through here before it is sent, so an event is safe on disk
whether or not a broker is reachable. The spool owns files and bytes only; it never talks to Kafka
(that is `producers.sdk.delivery`).

Layout of one spool directory (one writer process at a time, enforced with `flock` on `lock`; a
process claims a slot under the spool root by taking that lock, see `Spool.open_slot`)::

    <data_dir>/spool/<slot>/
        lock                      flock'ed by the process that owns the slot
        00000000000000000000.seg  segments, named by the sequence number of their first record
        00000000000000004096.seg
        cursor                    delivery state: next sequence to deliver + the in-flight intent

A segment starts with the magic `ASPOOL1\\n`, then frames: `u32 length, u32 crc32c(body), body`,
body = `u16 len(topic), u16 len(key), u16 len(event_id), topic, key, event_id, value` (big-endian).
Records are numbered by a sequence that never restarts within a slot. A frame that is cut short or
fails its CRC at the tail of the newest segment is a write that never finished (its `append` never
returned), so it is truncated on open; a bad frame anywhere else is corruption and raises
`SpoolError` naming the file and byte offset.

`cursor` holds two checksummed slots overwritten in turn (producers/sdk/spool_cursor.py), so a commit is
one write and one fdatasync, and a torn one leaves the previous cursor. Its `intent` records, before
a chunk is sent, which sequence range is in flight and a lower bound of every partition's end
offset; see `producers.sdk.delivery` for how that makes replays duplicate-free.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import NamedTuple

import crc32c

from clients.files import fsync_dir
from producers.errors import SpoolError, SpoolLocked
from producers.sdk.spool_cursor import Cursor, CursorFile, read_delivered

__all__ = ["Spool", "SpoolRecord", "has_pending", "slot_status"]

log = logging.getLogger(__name__)

MAGIC = b"ASPOOL1\n"
_FRAME = struct.Struct(">II")
_BODY = struct.Struct(">HHH")
SEGMENT_SUFFIX = ".seg"
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
NEW_SLOT_TRIES = 1024  # new slot numbers `open_slot` tries; each one it misses is held by a live process


class SpoolRecord(NamedTuple):
    """One spooled event: where it goes (topic, key), its id, its encoded bytes, its sequence.
    (A named tuple: one is built per event at least twice, and a tuple is the cheapest immutable.)"""

    topic: str
    key: bytes
    event_id: str
    value: bytes
    seq: int = -1


def encode_frame(record: SpoolRecord) -> bytes:
    """Frame one record (length + CRC32C + body).

    >>> frame = encode_frame(SpoolRecord("agent.events", b"t1", "e1", b"{}"))
    >>> decode_body(frame[8:]) == SpoolRecord("agent.events", b"t1", "e1", b"{}")
    True
    """
    topic, event_id = record.topic.encode(), record.event_id.encode()
    body = (
        _BODY.pack(len(topic), len(record.key), len(event_id)) + topic + record.key + event_id + record.value
    )
    return _FRAME.pack(len(body), crc32c.crc32c(body)) + body


def decode_body(body: bytes, seq: int = -1) -> SpoolRecord:
    """The record inside a frame body (the inverse of `encode_frame` after the 8-byte header)."""
    lt, lk, le = _BODY.unpack_from(body)
    pos = _BODY.size
    topic = body[pos : pos + lt].decode()
    pos += lt
    key = body[pos : pos + lk]
    pos += lk
    event_id = body[pos : pos + le].decode()
    return SpoolRecord(topic, bytes(key), event_id, bytes(body[pos + le :]), seq)


def scan_frames(data: bytes, start: int = len(MAGIC)) -> Iterator[tuple[int, int, bytes | None]]:
    """Yield `(offset, end, body)` for each frame of a segment's bytes; body None = torn or corrupt
    frame at `offset` (the scan stops there)."""
    pos = start
    while pos < len(data):
        if pos + _FRAME.size > len(data):
            yield pos, len(data), None
            return
        length, crc = _FRAME.unpack_from(data, pos)
        end = pos + _FRAME.size + length
        body = data[pos + _FRAME.size : end]
        if end > len(data) or crc32c.crc32c(body) != crc:
            yield pos, len(data), None
            return
        yield pos, end, body
        pos = end


def _segment_name(first_seq: int) -> str:
    return f"{first_seq:020d}{SEGMENT_SUFFIX}"


class Spool:
    """One spool directory, owned by this process while open (see the module docstring).

    `append` is for one writer thread and `read`/`commit` for one delivery thread; they may run
    concurrently (the writer only appends to the tail; `read` never sees a record before `append`
    returned, because `end_seq` is advanced only after the fsync).

    `read_cache_bytes` > 0 keeps the newest undelivered records this object appended in memory (up
    to that many value bytes) and `read` serves them from there: the same records, already fsynced,
    without reading back, CRC-checking and decoding each frame. Older records (a long outage, or
    what an earlier process spooled) are read from disk as always.
    """

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        fsync: bool = True,
        read_cache_bytes: int = 0,
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.read_cache_bytes = read_cache_bytes
        self._cache: deque[SpoolRecord] = deque()  # consecutive seqs, the last one is end_seq - 1
        self._cache_bytes = 0
        self._cache_lock = threading.Lock()
        self._lock_fd = _lock(self.directory / "lock")
        try:
            self._cursor_file = CursorFile(self.directory, fsync=fsync)
            self.cursor = self._cursor_file.load()
            self._segments: list[int] = sorted(self._list_segments())
            self.end_seq = self._recover_tail()
            self._tail = None
            self._reader: tuple[int, int, int] | None = None  # (segment first seq, byte offset, seq)
            self._drop_delivered_segments()
        except Exception:
            os.close(self._lock_fd)
            raise

    # --- opening ----------------------------------------------------------------------------------

    @classmethod
    def open_slot(cls, root: Path, **kwargs) -> Spool:
        """Open the first free slot under `root`, preferring one a crashed process left undelivered
        events in (so a restarted producer delivers them first, keeping trajectories in order).

        Safe for several processes at once: a slot belongs to whoever holds its `flock`, which one
        process at most can take, so two processes that both saw slot N free (or missing) both try
        it, one gets it and the other goes on to the next. Only other live processes can hold a
        lock, so the search for a new slot ends within as many tries as there are openers."""
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        existing = sorted(
            (p for p in root.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
        )
        for path in sorted(existing, key=lambda p: not has_pending(p)):
            with contextlib.suppress(SpoolLocked):
                return cls(path, **kwargs)
        first_new = max((int(p.name) for p in existing), default=-1) + 1
        for index in range(first_new, first_new + NEW_SLOT_TRIES):
            with contextlib.suppress(SpoolLocked):
                return cls(root / str(index), **kwargs)
        raise SpoolError(
            f"no free spool slot under {root}: slots {first_new}..{first_new + NEW_SLOT_TRIES - 1} "
            "are all held by other processes"
        )

    def _list_segments(self) -> Iterable[int]:
        for path in self.directory.glob("*" + SEGMENT_SUFFIX):
            stem = path.name[: -len(SEGMENT_SUFFIX)]
            if stem.isdigit():
                yield int(stem)

    def _segment_path(self, first_seq: int) -> Path:
        return self.directory / _segment_name(first_seq)

    def _recover_tail(self) -> int:
        """Count the records of the newest segment, truncating a torn or corrupt tail frame."""
        if not self._segments:
            return self.cursor.delivered
        first = self._segments[-1]
        path = self._segment_path(first)
        data = path.read_bytes()
        if not data.startswith(MAGIC):
            if len(data) < len(MAGIC) and MAGIC.startswith(data):
                path.write_bytes(MAGIC)  # crashed while creating the segment
                return first
            raise SpoolError(f"{path}: not a spool segment (bad magic {data[:8]!r})")
        count, good_end = 0, len(MAGIC)
        for offset, end, body in scan_frames(data):
            if body is None:
                log.warning(
                    "spool %s: truncating torn tail at byte %d (%d bytes)", path, offset, len(data) - offset
                )
                with open(path, "r+b") as handle:
                    handle.truncate(offset)
                    os.fsync(handle.fileno())
                break
            count, good_end = count + 1, end
        del good_end
        return first + count

    # --- writing ----------------------------------------------------------------------------------

    def append(self, records: Iterable[SpoolRecord]) -> int:
        """Append records durably (one fsync for the batch); returns the new `end_seq`."""
        records = list(records)
        if not records:
            return self.end_seq
        handle = self._tail_handle()
        handle.write(b"".join([encode_frame(r) for r in records]))
        handle.flush()
        if self.fsync:
            os.fsync(handle.fileno())
        if self.read_cache_bytes:
            self._remember(records, self.end_seq)
        self.end_seq += len(records)
        if handle.tell() >= self.segment_bytes:
            self._rotate()
        return self.end_seq

    def _remember(self, records: list[SpoolRecord], first_seq: int) -> None:
        """Keep freshly written records for `read` (see the class docstring), dropping the oldest
        beyond `read_cache_bytes`."""
        numbered = [SpoolRecord(r[0], r[1], r[2], r[3], seq) for seq, r in enumerate(records, first_seq)]
        size = sum(len(r[3]) for r in records)
        with self._cache_lock:
            cache = self._cache
            if cache and cache[-1].seq != first_seq - 1:
                cache.clear()
                self._cache_bytes = 0
            cache.extend(numbered)
            self._cache_bytes += size
            while self._cache_bytes > self.read_cache_bytes and len(cache) > 1:
                self._cache_bytes -= len(cache.popleft().value)

    def _forget(self, below_seq: int) -> None:
        """Drop cached records with `seq < below_seq` (delivered)."""
        with self._cache_lock:
            cache = self._cache
            while cache and cache[0].seq < below_seq:
                self._cache_bytes -= len(cache.popleft().value)

    def _read_cached(self, from_seq: int, max_records: int, max_bytes: int) -> list[SpoolRecord] | None:
        """What `read` returns, from the cache; None when `from_seq` is not (or no longer) there."""
        end = self.end_seq
        with self._cache_lock:
            cache = self._cache
            if not cache or not cache[0].seq <= from_seq <= cache[-1].seq + 1:
                return None
            out: list[SpoolRecord] = []
            size = 0
            for record in islice(cache, from_seq - cache[0].seq, None):
                if record.seq >= end or len(out) >= max_records or size >= max_bytes:
                    break
                out.append(record)
                size += len(record.value)
            return out

    def _tail_handle(self):
        if self._tail is None:
            if not self._segments:
                self._create_segment(self.end_seq)
            self._tail = open(self._segment_path(self._segments[-1]), "ab")  # noqa: SIM115 - closed in close()
        return self._tail

    def _create_segment(self, first_seq: int) -> None:
        path = self._segment_path(first_seq)
        with open(path, "wb") as handle:
            handle.write(MAGIC)
            handle.flush()
            if self.fsync:
                os.fsync(handle.fileno())
        if self.fsync:
            fsync_dir(self.directory)
        self._segments.append(first_seq)

    def _rotate(self) -> None:
        self._tail.close()
        self._tail = None
        self._create_segment(self.end_seq)

    # --- reading ----------------------------------------------------------------------------------

    def read(
        self, from_seq: int, max_records: int = 1000, max_bytes: int = 4 * 1024 * 1024
    ) -> list[SpoolRecord]:
        """Records `from_seq, from_seq+1, ...` (fewer when the spool ends or a limit is reached)."""
        if self.read_cache_bytes:
            cached = self._read_cached(from_seq, max_records, max_bytes)
            if cached is not None:
                return cached
        out: list[SpoolRecord] = []
        size = 0
        seq = from_seq
        while seq < self.end_seq and len(out) < max_records and size < max_bytes:
            batch = self._read_segment(seq, max_records - len(out))
            if not batch:
                break
            out.extend(batch)
            size += sum(len(r.value) for r in batch)
            seq = batch[-1].seq + 1
        return out

    def _read_segment(self, seq: int, limit: int) -> list[SpoolRecord]:
        first = self._segment_for(seq)
        path = self._segment_path(first)
        offset, current = len(MAGIC), first
        if self._reader and self._reader[0] == first and self._reader[2] <= seq:
            _, offset, current = self._reader
        out: list[SpoolRecord] = []
        with open(path, "rb") as handle:
            handle.seek(offset)
            while current < self.end_seq and len(out) < limit:
                header = handle.read(_FRAME.size)
                if len(header) < _FRAME.size:
                    break  # the rest lives in the next segment
                length, crc = _FRAME.unpack(header)
                body = handle.read(length)
                if len(body) < length or crc32c.crc32c(body) != crc:
                    raise SpoolError(f"{path}: corrupt frame at byte {offset} (seq {current})")
                if current >= seq:
                    out.append(decode_body(body, current))
                current += 1
                offset += _FRAME.size + length
        self._reader = (first, offset, current)
        return out

    def _segment_for(self, seq: int) -> int:
        candidates = [s for s in self._segments if s <= seq]
        if not candidates:
            raise SpoolError(f"{self.directory}: sequence {seq} is no longer in the spool")
        return candidates[-1]

    # --- delivery state ---------------------------------------------------------------------------

    def commit(self, cursor: Cursor) -> None:
        """Persist the delivery state (producers/sdk/spool_cursor.py), then drop segments wholly delivered."""
        self._cursor_file.commit(cursor)
        self.cursor = Cursor(cursor.delivered, cursor.intent)
        self._drop_delivered_segments()
        if self.read_cache_bytes:
            self._forget(cursor.delivered)

    def _drop_delivered_segments(self) -> None:
        """Delete every segment whose records all have `seq < delivered` (never the tail one)."""
        while len(self._segments) > 1 and self._segments[1] <= self.cursor.delivered:
            first = self._segments.pop(0)
            self._segment_path(first).unlink(missing_ok=True)
            if self._reader and self._reader[0] == first:
                self._reader = None

    @property
    def pending(self) -> int:
        """Records written but not yet acknowledged by the broker."""
        return self.end_seq - self.cursor.delivered

    def close(self) -> None:
        self._cursor_file.close()
        if self._tail is not None:
            self._tail.close()
            self._tail = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SpoolLocked(f"spool {path.parent} is in use by another process") from None
    return fd


def has_pending(directory: Path) -> bool:
    """Whether a spool directory holds records not yet delivered (read without taking the lock, so
    its owner may delete a delivered segment meanwhile: then it reads again)."""
    for _ in range(3):
        with contextlib.suppress(FileNotFoundError):
            return _has_pending(Path(directory))
    return True  # its owner keeps rotating segments: in use, and a lock attempt will say so


def _has_pending(directory: Path) -> bool:
    segments = sorted(p for p in directory.glob("*" + SEGMENT_SUFFIX))
    if not segments:
        return False
    delivered = read_delivered(directory)
    last = segments[-1]
    first = int(last.name[: -len(SEGMENT_SUFFIX)])
    if first > delivered:
        return True
    count = sum(1 for _, _, body in scan_frames(last.read_bytes()) if body is not None)
    return first + count > delivered


def slot_status(root: Path) -> list[dict]:
    """One row per spool slot under `root`: path, pending records, whether a process holds it."""
    rows = []
    for path in sorted((p for p in Path(root).iterdir() if p.is_dir()), key=lambda p: p.name):
        try:
            spool = Spool(path)
        except SpoolLocked:
            rows.append({"slot": path.name, "pending": None, "in_use": True})
            continue
        rows.append({"slot": path.name, "pending": spool.pending, "in_use": False})
        spool.close()
    return rows

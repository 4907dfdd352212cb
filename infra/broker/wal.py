"""The write-ahead file: one fsync per group commit round, whatever the number of partitions.

Under `--flush always` a produce is acknowledged once its records are on disk. Fsyncing every
partition log a round touched cost one `fdatasync` per log, about five a round at 1,000 steps/s
through the stack, each about 110 µs of the broker's CPU in the kernel (docs/benchmarks.md, fifth
and sixth passes). Instead, each append is written twice: to its partition log, as before (readers
read there, nothing fsynced), and as a frame to this one file, which the round fsyncs alone.

A checkpoint (every `CHECKPOINT_S`, or when the file passes `CHECKPOINT_BYTES`, run by the round's
`flush`) starts a new file, fsyncs the old one and every partition log appended to since the
previous checkpoint, and only then deletes the old files: a frame is deleted only once its records
are durable in their log.

Recovery (`replay`, when the store opens): the partition logs recover first (their torn tails cut).
Then every frame of the files left is compared with its log by offset: a frame whose records are
all there is skipped, the records from the log's end onwards are appended again (the same offsets,
since a frame's offset is where the log put them), and a frame beyond the log's end, which the order
of writes rules out, is reported. Frames name their topic by id, so a topic deleted and created
again never receives its predecessor's records. A torn last frame was never acknowledged (its
produce waited for this file's fsync) and is dropped.

Frame: u32 length of the rest, u32 CRC-32C of the rest, 16-byte topic id, i32 partition, i64 base
offset, the records as the producer sent them (the log assigns the same offsets on replay).
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from crc32c import crc32c

from clients.files import fsync_dir
from infra.broker.errors import BrokerStorageError
from infra.broker.records import iter_batches
from infra.broker.segment import sync_copy

log = logging.getLogger(__name__)

SUFFIX = ".wal"
CHECKPOINT_S = 2.0
CHECKPOINT_BYTES = 64 * 1024 * 1024
_HEAD = struct.Struct(">II")  # length of the rest, CRC-32C of the rest
_WHERE = struct.Struct(">16siq")  # topic id, partition, base offset


def frame_head(topic_id: uuid.UUID, partition: int, base_offset: int, records) -> bytes:
    """Everything of a frame before its records (written with them, not copied into one buffer)."""
    where = _WHERE.pack(topic_id.bytes, partition, base_offset)
    return _HEAD.pack(len(where) + len(records), crc32c(records, crc32c(where))) + where


def encode_frame(topic_id: uuid.UUID, partition: int, base_offset: int, records: bytes) -> bytes:
    return frame_head(topic_id, partition, base_offset, records) + bytes(records)


def read_frames(path: Path) -> Iterator[tuple[uuid.UUID, int, int, memoryview]]:
    """(topic id, partition, base offset, records) of every whole frame, up to a torn or corrupt one."""
    data = memoryview(path.read_bytes())
    pos = 0
    while pos + _HEAD.size <= len(data):
        length, crc = _HEAD.unpack_from(data, pos)
        body = data[pos + _HEAD.size : pos + _HEAD.size + length]
        if length < _WHERE.size or len(body) < length or crc32c(body) != crc:
            if pos + _HEAD.size + length < len(data):
                log.error("%s: corrupt frame at byte %d, the rest of the file is ignored", path, pos)
            return
        topic, partition, base = _WHERE.unpack_from(body)
        yield uuid.UUID(bytes=topic), partition, base, body[_WHERE.size :]
        pos += _HEAD.size + length


class WriteAhead:
    """The broker's write-ahead files under `directory` (see the module docstring). Thread-safe:
    appends run on the event loop, `flush` and `checkpoint` in the group commit's thread."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._files = sorted((p for p in self.directory.glob(f"*{SUFFIX}")), key=_number)
        self._next_number = _number(self._files[-1]) + 1 if self._files else 0
        self._fd = -1
        self._size = 0
        self._dirty = False
        self._touched: dict[int, object] = {}  # id(log) -> log appended to since the last checkpoint
        self._last_checkpoint = time.monotonic()

    # -- writing
    def append(self, partition_log, topic_id: uuid.UUID, partition: int, base_offset: int, records) -> None:
        head = frame_head(topic_id, partition, base_offset, records)
        size = len(head) + len(records)
        if self._fd < 0:
            self._open_first()
        with self._lock:
            done = os.writev(self._fd, [head, records])
            if done < size:  # rare: a short write; the rest from one buffer
                rest = memoryview(head + bytes(records))
                while done < size:
                    done += os.write(self._fd, rest[done:])
            self._size += size
            self._dirty = True
            self._touched[id(partition_log)] = partition_log

    def _new_file(self) -> tuple[int, Path]:
        with self._lock:
            path = self.directory / f"{self._next_number:020d}{SUFFIX}"
            self._next_number += 1
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        fsync_dir(self.directory)  # the new name is durable before any frame in it is acknowledged
        return fd, path

    def _open_first(self) -> None:
        fd, path = self._new_file()
        with self._lock:
            self._fd, self._size = fd, 0
            self._files.append(path)

    def flush(self) -> None:
        """fsync what was appended since the last flush (the group commit round's one fsync), after
        a checkpoint when one is due. Runs in the group commit's thread."""
        if self.checkpoint_due():
            self.checkpoint()
        with self._lock:
            if not self._dirty:
                return
            fd = os.dup(self._fd)
            self._dirty = False
        sync_copy(fd, self._unsynced)

    def _unsynced(self) -> None:
        self._dirty = True

    def checkpoint_due(self) -> bool:
        return self._size >= CHECKPOINT_BYTES or time.monotonic() - self._last_checkpoint >= CHECKPOINT_S

    def checkpoint(self) -> None:
        """New appends go to a new file; the old file is fsynced (its frames may wait for this
        round), then every log appended to before, and only then are the old files deleted."""
        self._last_checkpoint = time.monotonic()
        if self._fd < 0:
            return
        new_fd, new_path = self._new_file()  # here, not on the event loop: the next append's file
        with self._lock:
            old_fd, self._fd, self._dirty, self._size = self._fd, new_fd, False, 0
            old, self._files = self._files, [new_path]
            logs, self._touched = list(self._touched.values()), {}
        try:
            os.fdatasync(old_fd)
            for partition_log in logs:
                partition_log.flush()
        except Exception:
            with self._lock:  # keep the files and fsync them again at the next checkpoint
                self._files = old + self._files
                self._touched.update((id(pl), pl) for pl in logs)
                self._dirty = True
            raise
        finally:
            os.close(old_fd)
        for path in old:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        """After every log was closed (fsynced): nothing here is needed any more."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            for path in self._files:
                path.unlink(missing_ok=True)
            self._files = []

    # -- recovery
    def replay(self, find_log: Callable[[uuid.UUID, int], object | None]) -> int:
        """Re-append what the partition logs lost (see the module docstring); returns the number of
        records restored. `find_log(topic_id, partition)`: the log, or None for a deleted topic."""
        restored = 0
        for path in self._files:
            for topic_id, partition, base, records in read_frames(path):
                partition_log = find_log(topic_id, partition)
                if partition_log is not None:
                    restored += _restore(partition_log, base, records, path)
        return restored


def _restore(partition_log, base: int, records: memoryview, path: Path) -> int:
    """Append the part of one frame's records at or after the log's end; the count appended."""
    end = partition_log.high_watermark
    if base > end:
        log.error("%s: records from offset %d for %r, whose log ends at %d", path, base, partition_log, end)
        return 0
    offset, missing = base, []
    for header, batch in iter_batches(records):
        if offset >= end:
            missing.append(bytes(batch))
        offset += header.last_offset_delta + 1
    if not missing:
        return 0
    try:
        result = partition_log.append(b"".join(missing), sync=False)
    except BrokerStorageError as exc:  # loud, but the broker starts: the rest is still served
        log.error("%s: could not restore offsets from %d of %r: %s", path, end, partition_log, exc)
        return 0
    first, last = result.base_offset, result.last_offset
    log.warning("%s: restored offsets %d..%d of %r", path, first, last, partition_log)
    return last - first + 1


def _number(path: Path) -> int:
    return int(path.name[: -len(SUFFIX)])

"""The spool's delivery cursor on disk: two checksummed slots in one file, overwritten in turn.

`cursor` (in the spool directory) holds slot 0 at byte 0 and slot 1 at byte 256 KiB (a sparse file
of 512 KiB; a slot takes a few hundred bytes). A slot is `u32 length, u32 crc32c(payload), payload`,
payload = `u64 generation` + the cursor as JSON
(`{"delivered": N, "intent": {...} | null}`). Commit number g is written over slot `g % 2`, then
fdatasynced; the other slot still holds commit g - 1. Reading takes the valid slot with the higher
generation, so a write cut short (a crash, a power loss) leaves the previous cursor, which is what
delivery expects after a crash before the write returned (see `producers.sdk.delivery`).

Why not a file replaced by rename: every commit (two per delivered chunk) then created an inode and
deleted one. On ext4 without a journal each new inode is searched for past the recently deleted ones,
which made that churn cost 20% of a simulated agent's CPU at 1,000 steps/s in `bench e2e`, and slowed
every other process on the disk creating files (chDB writing parts). Here the file is created once.

A spool last written by a version that kept `cursor.json` (replaced by rename) is read from there;
the first commit writes `cursor` and removes `cursor.json`.
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
import orjson

from clients.files import fsync_dir
from producers.errors import SpoolError

CURSOR_FILE = "cursor"
LEGACY_CURSOR_FILE = "cursor.json"
SLOT_BYTES = 256 * 1024  # room for an intent naming thousands of partitions
_SLOT_HEADER = struct.Struct(">II")
_GENERATION = struct.Struct(">Q")


@dataclass
class DeliveryIntent:
    """A chunk `[first, last]` was (possibly) sent; `offsets` are lower bounds of the end offsets of
    every partition of the topics involved, taken before the send: anything of the chunk that the
    broker stored sits at or after them."""

    first: int
    last: int
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)


@dataclass
class Cursor:
    """Persisted delivery state: every record with `seq < delivered` is acknowledged by the broker."""

    delivered: int = 0
    intent: DeliveryIntent | None = None


def cursor_to_json(cursor: Cursor) -> bytes:
    data: dict = {"delivered": cursor.delivered, "intent": None}
    if cursor.intent:
        offsets = {t: {str(p): o for p, o in parts.items()} for t, parts in cursor.intent.offsets.items()}
        data["intent"] = {"first": cursor.intent.first, "last": cursor.intent.last, "offsets": offsets}
    return orjson.dumps(data)


def cursor_from_json(raw: dict) -> Cursor:
    intent = raw.get("intent")
    if intent:
        offsets = {t: {int(p): int(o) for p, o in parts.items()} for t, parts in intent["offsets"].items()}
        intent = DeliveryIntent(int(intent["first"]), int(intent["last"]), offsets)
    return Cursor(int(raw.get("delivered", 0)), intent)


def encode_slot(generation: int, cursor: Cursor) -> bytes:
    """One slot's bytes (unpadded); `SpoolError` when the cursor does not fit in SLOT_BYTES."""
    payload = _GENERATION.pack(generation) + cursor_to_json(cursor)
    slot = _SLOT_HEADER.pack(len(payload), crc32c.crc32c(payload)) + payload
    if len(slot) > SLOT_BYTES:
        raise SpoolError(f"delivery cursor of {len(slot)} bytes does not fit a {SLOT_BYTES}-byte slot")
    return slot


def decode_slot(data: bytes) -> tuple[int, Cursor] | None:
    """(generation, cursor) of one slot, or None when it is empty, torn or corrupt."""
    if len(data) < _SLOT_HEADER.size:
        return None
    length, crc = _SLOT_HEADER.unpack_from(data)
    payload = data[_SLOT_HEADER.size : _SLOT_HEADER.size + length]
    if length < _GENERATION.size or len(payload) != length or crc32c.crc32c(payload) != crc:
        return None
    (generation,) = _GENERATION.unpack_from(payload)
    try:
        return generation, cursor_from_json(orjson.loads(payload[_GENERATION.size :]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


class CursorFile:
    """The cursor of one spool directory (used by the spool's one delivery thread)."""

    def __init__(self, directory: Path, fsync: bool = True):
        self.directory = Path(directory)
        self.path = self.directory / CURSOR_FILE
        self.fsync = fsync
        self.generation = 0
        self._fd: int | None = None

    def load(self) -> Cursor:
        """The newest cursor committed (from the legacy `cursor.json` if this file is not there)."""
        found = read_slots(self.path)
        if found is not None:
            self.generation = found[0]
            return found[1]
        legacy = self.directory / LEGACY_CURSOR_FILE
        if not legacy.exists():
            return Cursor()
        try:
            return cursor_from_json(orjson.loads(legacy.read_bytes()))
        except orjson.JSONDecodeError as exc:
            raise SpoolError(f"{legacy}: unreadable delivery cursor ({exc})") from None

    def commit(self, cursor: Cursor) -> None:
        """Write `cursor` over the older slot and make it durable."""
        first = self._fd is None  # this process's first commit: the file may be new
        if first:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self.generation += 1
        os.pwrite(self._fd, encode_slot(self.generation, cursor), (self.generation % 2) * SLOT_BYTES)
        if first:
            os.ftruncate(self._fd, 2 * SLOT_BYTES)  # its size never changes again: fdatasync suffices
        if self.fsync:
            (os.fsync if first else os.fdatasync)(self._fd)
            if first:
                fsync_dir(self.directory)
        if first:
            # `cursor` is durable and read first from now on (a crash before this unlink is harmless)
            with contextlib.suppress(FileNotFoundError):
                (self.directory / LEGACY_CURSOR_FILE).unlink()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_slots(path: Path) -> tuple[int, Cursor] | None:
    """The newest valid slot of a cursor file: (generation, cursor); None if there is none."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    slots = [decode_slot(data[start : start + SLOT_BYTES]) for start in (0, SLOT_BYTES)]
    valid = [slot for slot in slots if slot is not None]
    return max(valid, key=lambda slot: slot[0]) if valid else None


def read_delivered(directory: Path) -> int:
    """`delivered` of a spool directory's cursor, read without its lock (0 when unreadable)."""
    found = read_slots(Path(directory) / CURSOR_FILE)
    if found is not None:
        return found[1].delivered
    with contextlib.suppress(FileNotFoundError, orjson.JSONDecodeError, ValueError, TypeError):
        return int(orjson.loads((Path(directory) / LEGACY_CURSOR_FILE).read_bytes()).get("delivered", 0))
    return 0

"""Idempotent-producer state of one partition: sequence checks, duplicate detection, snapshots.

Owns the rules Kafka applies to batches with a producer id: per producer id the latest epoch and
the last 5 batches (base sequence, last sequence, base offset, last offset). A retry of one of them
is a duplicate; anything else must carry the next sequence. It does no I/O except reading and
writing its snapshot files (`<offset:020d>.snapshot`, JSON), which `PartitionLog` asks for.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from pathlib import Path

from infra.broker.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from infra.broker.records import next_sequence
from infra.broker.segment import NO_TIMESTAMP, write_file_atomic

log = logging.getLogger(__name__)

PRODUCER_BATCHES_KEPT = 5  # Kafka keeps the last 5 batches per producer for duplicate detection
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOTS_KEPT = 2
PRODUCER_EXPIRATION_MS = 7 * 24 * 3600 * 1000  # Kafka: producer.id.expiration.ms (1 day); we keep longer


class ProducerEntry:
    """Last epoch and up to 5 batches (base_seq, last_seq, base_offset, last_offset) of one producer id."""

    __slots__ = ("batches", "epoch", "last_timestamp")

    def __init__(self, epoch: int, batches=(), last_timestamp: int = NO_TIMESTAMP):
        self.epoch = epoch
        self.batches: deque[tuple[int, int, int, int]] = deque(batches, maxlen=PRODUCER_BATCHES_KEPT)
        self.last_timestamp = last_timestamp

    def copy(self) -> ProducerEntry:
        return ProducerEntry(self.epoch, self.batches, self.last_timestamp)

    def to_json(self) -> dict:
        return {"epoch": self.epoch, "batches": [list(b) for b in self.batches], "ts": self.last_timestamp}

    @classmethod
    def from_json(cls, data: dict) -> ProducerEntry:
        return cls(data["epoch"], [tuple(b) for b in data["batches"]], data.get("ts", NO_TIMESTAMP))


def check_sequence(
    entry: ProducerEntry | None, producer_id: int, epoch: int, base_seq: int, last_seq: int
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


def record_batch(
    producers: dict[int, ProducerEntry], pid: int, epoch: int, seqs: tuple[int, int, int, int], ts: int
) -> None:
    entry = producers.get(pid)
    if entry is None or entry.epoch != epoch:
        entry = producers[pid] = ProducerEntry(epoch)
    entry.batches.append(seqs)
    entry.last_timestamp = max(entry.last_timestamp, ts)


def _snapshot_paths(directory: Path) -> list[tuple[int, Path]]:
    found = []
    for path in directory.glob(f"*{SNAPSHOT_SUFFIX}"):
        name = path.name[: -len(SNAPSHOT_SUFFIX)]
        if name.isdigit():
            found.append((int(name), path))
    return sorted(found)


def load_snapshot(directory: Path, log_start: int, hw: int) -> tuple[int, dict[int, ProducerEntry]]:
    """The newest usable snapshot: (offset it covers, producers). (log_start, {}) when none is usable.

    Snapshots above `hw` (the log was truncated below them) or below `log_start` (retention removed
    the batches after them) are deleted.
    """
    for offset, path in reversed(_snapshot_paths(directory)):
        if offset > hw or offset < log_start:
            path.unlink(missing_ok=True)
            continue
        try:
            data = json.loads(path.read_bytes())
            return offset, {int(k): ProducerEntry.from_json(v) for k, v in data["producers"].items()}
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable producer snapshot %s: %s", path, exc)
    return log_start, {}


def write_snapshot(directory: Path, producers: dict[int, ProducerEntry], offset: int) -> None:
    """Persist `producers` as the state after every batch below `offset`; keep the newest two."""
    data = {"offset": offset, "producers": {str(k): v.to_json() for k, v in producers.items()}}
    path = directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"
    write_file_atomic(path, json.dumps(data, separators=(",", ":")).encode(), sync=True)
    for _, old in _snapshot_paths(directory)[:-SNAPSHOTS_KEPT]:
        old.unlink(missing_ok=True)


def expire_producers(producers: dict[int, ProducerEntry], now_ms: int) -> int:
    """Forget producers silent for PRODUCER_EXPIRATION_MS (each client start gets a new id, so the map
    would grow forever). A forgotten producer that comes back is accepted like an unknown one."""
    cutoff = now_ms - PRODUCER_EXPIRATION_MS
    stale = [pid for pid, entry in producers.items() if 0 <= entry.last_timestamp < cutoff]
    for pid in stale:
        del producers[pid]
    return len(stale)

"""The executor's row source (since 1.5): a batch's `batch.rows` chunks assembled and verified, so an
executor trains without the trainer's disk. Pure: no Kafka, no files.

`BatchRowsAssembler.add` keeps each chunk under its batch id and rows checksum (duplicates of a
re-published batch are dropped); `take(built, record)` hands back the rows of a `batch.built` once
every chunk is there, the count is `row_count` and the canonical checksum is `rows_sha256`, and
otherwise raises `Refused` (the loop dead-letters the `batch.built` with its coordinates; the reason
names the chunks' offsets and what is wrong). `holds()` is, per partition, the offset of the first
chunk of a batch still being assembled: the follower commits no further, so a kill -9 mid-assembly
re-reads every chunk and loses nothing.

Memory is bounded: at most `max_open` batches and `max_bytes` of chunk records (as received) are
held. A batch's chunks are published in one go before its `batch.built` (`consumers.batching`), so an
assembly that a later `batch.built` on the same partition overtakes was cut short by a trainer crash:
it is abandoned (the trainer re-publishes the whole batch after its restart), which releases its hold.
Past the bounds the oldest assembly is abandoned too; a `batch.built` whose chunks were abandoned
is dead-lettered as missing chunks, never trained on part of its rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from clients.kafka.consume import Refused
from consumers.batching.row_chunks import rows_sha256
from schemas.events import BatchBuilt, BatchRows
from schemas.records import Record

log = logging.getLogger(__name__)

MAX_OPEN_BATCHES = 16
MAX_HELD_BYTES = 1 << 30  # chunk records as received; the decoded rows take a few times more

Partition = tuple[str, int]


@dataclass
class Assembly:
    """The chunks of one batch seen so far."""

    batch_id: str
    rows_sha256: str
    chunks: int
    first: Record  # the first chunk's coordinates: the commit is held here
    parts: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    offsets: dict[int, int] = field(default_factory=dict)
    size: int = 0

    @property
    def partition(self) -> Partition:
        return (self.first.topic, self.first.partition)

    def describe(self) -> str:
        seen = ", ".join(f"{i}@{self.offsets[i]}" for i in sorted(self.offsets)) or "none"
        return (
            f"batch {self.batch_id}: chunks seen (index@offset) on {self.first.topic}"
            f"[{self.first.partition}]: {seen} of {self.chunks}"
        )


class BatchRowsAssembler:
    """Chunks per batch, bounded; see the module docstring."""

    def __init__(self, max_open: int = MAX_OPEN_BATCHES, max_bytes: int = MAX_HELD_BYTES):
        self.max_open, self.max_bytes = max_open, max_bytes
        self.open: dict[tuple[str, str], Assembly] = {}  # (batch id, rows_sha256) -> assembly
        self.held = 0
        self.abandoned = 0
        self.duplicates = 0

    def add(self, event: BatchRows, record: Record) -> None:
        """Keep one chunk. A chunk that disagrees with the others of its batch, or alone exceeds the
        memory bound, is `Refused` (dead-lettered)."""
        if event.index >= event.chunks:
            raise Refused(f"index: {event.index} is not below chunks ({event.chunks})", "ChunkMismatch")
        key = (event.batch_id, event.rows_sha256)
        assembly = self.open.get(key)
        if assembly is None:
            assembly = Assembly(event.batch_id, event.rows_sha256, event.chunks, record)
            log.info(
                "executor: assembling batch %s: %d chunks from %s (the commit is held there)",
                event.batch_id,
                event.chunks,
                record.describe(),
            )
        elif assembly.chunks != event.chunks:
            raise Refused(
                f"chunks: {event.chunks} disagrees with {assembly.chunks} of the chunks before it; "
                f"{assembly.describe()}",
                "ChunkMismatch",
            )
        if event.index in assembly.parts:
            self.duplicates += 1  # a re-published batch: the same event again
            return
        size = len(record.value or b"")
        if assembly.size + size > self.max_bytes:
            raise Refused(
                f"batch {event.batch_id}: chunk {event.index} ({size} bytes) would take the batch's "
                f"chunks to {assembly.size + size} bytes, over the executor's bound of {self.max_bytes} "
                "bytes held for assembly",
                "BatchTooLarge",
            )
        self.open.pop(key, None)
        self._make_room(size)
        assembly.parts[event.index] = list(event.rows)
        assembly.offsets[event.index] = record.offset
        assembly.size += size
        self.held += size
        self.open[key] = assembly  # the most recently fed last: eviction takes the oldest first

    def _make_room(self, size: int) -> None:
        while self.open and (len(self.open) >= self.max_open or self.held + size > self.max_bytes):
            oldest = next(iter(self.open.values()))
            self._abandon(oldest, f"over the bound of {self.max_open} batches / {self.max_bytes} bytes")

    def _abandon(self, assembly: Assembly, why: str) -> None:
        self.open.pop((assembly.batch_id, assembly.rows_sha256), None)
        self.held -= assembly.size
        self.abandoned += 1
        log.warning("executor: abandoning %s (%s)", assembly.describe(), why)

    def discard(self, batch_id: str) -> None:
        """Forget every assembly of `batch_id` (its batch is trained already, or not followed)."""
        for assembly in [a for a in self.open.values() if a.batch_id == batch_id]:
            self.open.pop((assembly.batch_id, assembly.rows_sha256))
            self.held -= assembly.size

    def overtaken(self, built: BatchBuilt, record: Record) -> None:
        """Abandon the assemblies of other batches on `record`'s partition that started before it:
        their publishing was cut short (see the module docstring)."""
        for assembly in list(self.open.values()):
            if (
                assembly.batch_id != built.batch_id
                and assembly.partition == (record.topic, record.partition)
                and assembly.first.offset < record.offset
            ):
                self._abandon(assembly, f"overtaken by batch.built of {built.batch_id} at {record.offset}")

    def take(self, built: BatchBuilt, record: Record) -> list[dict[str, Any]]:
        """The verified rows of `built` (chunks > 0); every assembly of its batch id is closed."""
        self.overtaken(built, record)
        assembly = self.open.get((built.batch_id, built.rows_sha256))
        self.discard(built.batch_id)
        where = f"batch.built of {built.batch_id} at {record.topic}[{record.partition}]@{record.offset}"
        if assembly is None:
            raise Refused(
                f"{where}: none of its {built.chunks} batch.rows chunks with rows_sha256 "
                f"{built.rows_sha256!r} came before it",
                "MissingChunks",
            )
        missing = sorted(set(range(built.chunks)) - set(assembly.parts))
        if assembly.chunks != built.chunks or missing:
            raise Refused(
                f"{where}: chunks {built.chunks}, missing {missing or 'none'}; {assembly.describe()}",
                "MissingChunks",
            )
        rows = [row for index in range(built.chunks) for row in assembly.parts[index]]
        if len(rows) != built.row_count:
            raise Refused(
                f"{where}: row_count {built.row_count}, the chunks hold {len(rows)}; {assembly.describe()}",
                "RowCountMismatch",
            )
        digest = rows_sha256(rows)
        if digest != built.rows_sha256:
            raise Refused(
                f"{where}: rows_sha256 {built.rows_sha256!r}, the assembled rows hash to {digest!r}; "
                f"{assembly.describe()}",
                "ChecksumMismatch",
            )
        return rows

    def holds(self) -> dict[Partition, int]:
        """Per partition, the offset of the first chunk of a batch still being assembled."""
        held: dict[Partition, int] = {}
        for assembly in self.open.values():
            tp = assembly.partition
            held[tp] = min(held.get(tp, assembly.first.offset), assembly.first.offset)
        return held

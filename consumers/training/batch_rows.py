"""The executor's row source (since 1.5): a batch's `batch.rows` chunks assembled and verified, so an
executor trains without the trainer's disk. The assembler is pure; `LogReader` is its one reader of
the log (a consumer of its own, from the factory in `clients.kafka`).

`BatchRowsAssembler.add` keeps each chunk under its batch id and rows checksum (duplicates of a
re-published batch are dropped); `take(built, record)` hands back the rows of a `batch.built` once
every chunk is there, the count is `row_count` and the canonical checksum is `rows_sha256`, and
otherwise raises `Refused` (the loop dead-letters the `batch.built` with its coordinates; the reason
names the chunks' offsets and what is wrong). `holds()` is, per partition, the offset of the first
chunk of a batch still being assembled: the follower commits no further, so a kill -9 mid-assembly
re-reads every chunk and loses nothing.

Memory: a chunk is kept as the record's value (the bytes received) and decoded only when its batch
is complete, so what is held is what is counted: at most `max_bytes` (`--max-assembly-mb`) of chunk
records, in at most `max_open` batches; decoded rows take about four times their JSON, and only the
batch being trained is decoded. One batch over `max_bytes` is refused (`BatchTooLarge`).

Past either bound the least recently fed batch is *set aside*, not lost: its chunks are freed, and
its batch id, checksum and first chunk's offset are kept, with its commit hold. When its
`batch.built` comes, its chunks are read again from the log (`LogReader`: that partition, from the
first chunk to the `batch.built`, chunks keyed by the batch id) and checked as usual. So a flood of
fake batch ids or of large chunks costs re-reads, never a legitimate batch. If the log cannot be
read (no reader given, the broker not answering in time) the `batch.built` raises `ChunksUnavailable`,
which is retryable (`clients.kafka.poison`): the follower exits, nothing past the hold was
committed, and the restart reads from the first chunk.

Why re-read rather than hold: holding every chunk is what the bound forbids, and giving up the batch
is what an attacker wants. The re-read is one bounded read of one partition range, rare (only set
aside batches pay it), and needs nothing kept but under 1 KB per set-aside batch. A flood that
sets every batch aside makes each re-read scan the flood's records between that batch's first chunk
and its `batch.built` (skipped by key, not decoded): slower, not lost.

The limit, stated: an assembly that never completes (a fake batch id, or a trainer that died
mid-publish and never re-publishes) holds its partition's commit until it is forgotten; at most
`max_set_aside` (`MAX_SET_ASIDE`) set-aside batches are remembered, and past that the one set aside
first is forgotten and its hold released. So anyone who can write to `training.batches` can make a
legitimate batch untrainable only by getting more than `MAX_SET_ASIDE` never-completed batches set
aside between that batch's first chunk and its `batch.built` (which the trainer publishes right
after its chunks, within milliseconds): its `batch.built` is then dead-lettered as `MissingChunks`
with its coordinates (never trained on part of its rows) and can be replayed from the dead letters.
Until then a flood costs the executor re-reads and a longer replay after a restart (the commit stays
at the oldest remembered unfinished batch), never memory past the bounds. A writer can of course
publish a whole batch of its own: the topic is trusted for what it carries, only not to exhaust us.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from clients.kafka import make_consumer
from clients.kafka.consume import Refused
from clients.kafka.ranges import ReadIncomplete, iter_range, topic_partitions
from consumers.batching.row_chunks import rows_sha256
from consumers.errors import TrainerError
from schemas.codec import decode
from schemas.errors import DecodeError
from schemas.events import BatchBuilt, BatchRows
from schemas.records import Record

log = logging.getLogger(__name__)

MAX_OPEN_BATCHES = 16
DEFAULT_MAX_ASSEMBLY_MB = 256  # `--max-assembly-mb`: chunk records held, as received
MAX_SET_ASIDE = 4096  # set-aside batches remembered (under 1 KB each)
CLIENT_ID = "trainer-executor-reread"

Partition = tuple[str, int]
Key = tuple[str, str]  # (batch id, rows_sha256)
# (topic, partition, from offset, to offset (excluded)) -> those records, in offset order
Reread = Callable[[str, int, int, int], Iterable[Record]]


class ChunksUnavailable(TrainerError):
    """A set-aside batch's chunks could not be read again from the log now. Not the batch's fault:
    retryable, so the follow loop raises it (the follower exits; the commit is held at the first
    chunk, so the restart reads them again) instead of dead-lettering the `batch.built`."""

    retryable = True  # clients.kafka.poison.is_poison: an outage, not a poison


@dataclass
class Assembly:
    """The chunks of one batch seen so far, as received."""

    batch_id: str
    rows_sha256: str
    chunks: int
    first: Record  # the first chunk's coordinates only (no value): the commit is held here
    parts: dict[int, bytes] = field(default_factory=dict)  # index -> the chunk record's value
    offsets: dict[int, int] = field(default_factory=dict)
    size: int = 0

    @property
    def partition(self) -> Partition:
        return (self.first.topic, self.first.partition)

    def complete(self, built: BatchBuilt) -> bool:
        return self.chunks == built.chunks and len(self.parts) == built.chunks

    def describe(self) -> str:
        seen = ", ".join(f"{i}@{self.offsets[i]}" for i in sorted(self.offsets)) or "none"
        return (
            f"batch {self.batch_id}: chunks seen (index@offset) on {self.first.topic}"
            f"[{self.first.partition}]: {seen} of {self.chunks}"
        )


def _coordinates(record: Record) -> Record:
    return Record(record.topic, record.partition, record.offset)


class BatchRowsAssembler:
    """Chunks per batch, bounded; see the module docstring."""

    def __init__(
        self,
        max_open: int = MAX_OPEN_BATCHES,
        max_bytes: int = DEFAULT_MAX_ASSEMBLY_MB << 20,
        reread: Reread | None = None,
        max_set_aside: int = MAX_SET_ASIDE,
    ):
        self.max_open, self.max_bytes, self.max_set_aside = max_open, max_bytes, max_set_aside
        self.reread = reread
        self.open: dict[Key, Assembly] = {}  # least recently fed first
        self.aside: dict[Key, Assembly] = {}  # chunks freed, hold kept; set aside first, first
        self.held = 0  # bytes of chunk records held (open assemblies, and a re-read under way)
        self.set_aside = self.forgotten = self.rereads = self.duplicates = 0

    def add(self, event: BatchRows, record: Record) -> None:
        """Keep one chunk. A chunk that disagrees with the others of its batch, or takes its batch
        over the memory bound, is `Refused` (dead-lettered)."""
        key = (event.batch_id, event.rows_sha256)
        assembly = self.open.get(key)
        if assembly is None:
            assembly = Assembly(event.batch_id, event.rows_sha256, event.chunks, _coordinates(record))
            log.info(
                "executor: assembling batch %s: %d chunks from %s (the commit is held there)",
                event.batch_id,
                event.chunks,
                record.describe(),
            )
        if not self._fits(assembly, event, record):
            return
        self.open.pop(key, None)
        self._make_room(len(record.value or b""), slots=1)
        self._store(assembly, event.index, record)
        self.open[key] = assembly  # the most recently fed last: the oldest is set aside first

    def _fits(self, assembly: Assembly, event: BatchRows, record: Record) -> bool:
        """Whether to store `event` in `assembly` (False: a duplicate); `Refused` when it cannot be."""
        if event.index >= event.chunks:
            raise Refused(f"index: {event.index} is not below chunks ({event.chunks})", "ChunkMismatch")
        if assembly.chunks != event.chunks:
            raise Refused(
                f"chunks: {event.chunks} disagrees with {assembly.chunks} of the chunks before it; "
                f"{assembly.describe()}",
                "ChunkMismatch",
            )
        if event.index in assembly.parts:
            self.duplicates += 1  # a re-published batch: the same event again
            return False
        size = len(record.value or b"")
        if assembly.size + size > self.max_bytes:
            raise Refused(
                f"batch {event.batch_id}: chunk {event.index} ({size} bytes) would take the batch's "
                f"chunks to {assembly.size + size} bytes, over the executor's bound of {self.max_bytes} "
                "bytes held for assembly (--max-assembly-mb)",
                "BatchTooLarge",
            )
        return True

    def _store(self, assembly: Assembly, index: int, record: Record) -> None:
        value = record.value or b""
        assembly.parts[index], assembly.offsets[index] = value, record.offset
        assembly.size += len(value)
        self.held += len(value)

    def _make_room(self, size: int, slots: int) -> None:
        """Set aside the least recently fed batches until `size` more bytes (and `slots` more
        batches) fit in the bounds."""
        while self.open and (len(self.open) + slots > self.max_open or self.held + size > self.max_bytes):
            self._set_aside(next(iter(self.open.values())))

    def _set_aside(self, assembly: Assembly) -> None:
        key = (assembly.batch_id, assembly.rows_sha256)
        self.open.pop(key)
        self.held -= assembly.size
        self.set_aside += 1
        earlier = self.aside.get(key)
        if earlier is None or assembly.first.offset < earlier.first.offset:
            self.aside[key] = replace(assembly, parts={}, offsets={}, size=0)  # the hold only
        log.info(
            "executor: setting aside %s (over the bound of %d batches / %d bytes); its chunks will be "
            "read again from the log when its batch.built comes",
            assembly.describe(),
            self.max_open,
            self.max_bytes,
        )
        while len(self.aside) > self.max_set_aside:
            oldest = next(iter(self.aside.values()))
            del self.aside[(oldest.batch_id, oldest.rows_sha256)]
            self.forgotten += 1
            log.warning(
                "executor: forgetting set-aside batch %s from %s (over %d set aside); its commit hold "
                "is released",
                oldest.batch_id,
                oldest.first.describe(),
                self.max_set_aside,
            )

    def _forget(self, key: Key) -> None:
        assembly = self.open.pop(key, None)
        if assembly is not None:
            self.held -= assembly.size
        self.aside.pop(key, None)

    def discard(self, batch_id: str) -> None:
        """Forget every assembly of `batch_id` (its batch is trained already, or not followed)."""
        for key in [k for k in (*self.open, *self.aside) if k[0] == batch_id]:
            self._forget(key)

    def take(self, built: BatchBuilt, record: Record) -> list[dict[str, Any]]:
        """The verified rows of `built` (chunks > 0); a set-aside batch's chunks are read again from
        the log first. Trained: every assembly of its batch id is closed; refused: only the one of
        its checksum (a forged `batch.built` cannot close a legitimate batch's chunks)."""
        key = (built.batch_id, built.rows_sha256)
        where = f"batch.built of {built.batch_id} at {record.topic}[{record.partition}]@{record.offset}"
        assembly, aside, reread = self.open.get(key), self.aside.get(key), None
        try:
            if aside is not None and not (assembly is not None and assembly.complete(built)):
                assembly = reread = self._reread(aside, built, record, where)
            rows = self._verified(assembly, built, where)
        except Refused:
            self._forget(key)
            raise
        finally:
            if reread is not None:
                self.held -= reread.size
        self.discard(built.batch_id)
        return rows

    def _reread(self, aside: Assembly, built: BatchBuilt, record: Record, where: str) -> Assembly:
        """The chunks of a set-aside batch, read again from its first chunk up to `record`."""
        if self.reread is None:
            raise ChunksUnavailable(
                f"{where}: its chunks from {aside.first.describe()} were set aside and this executor "
                "has no log reader to read them again; exiting so that a restart reads them"
            )
        log.info("executor: reading the chunks of %s again from %s", built.batch_id, aside.first.describe())
        self.rereads += 1
        assembly = Assembly(built.batch_id, built.rows_sha256, aside.chunks, aside.first)
        records = None
        try:
            records = self.reread(record.topic, record.partition, aside.first.offset, record.offset)
            for found in records:
                self._reread_one(assembly, built, found)
        except BaseException as exc:
            self.held -= assembly.size  # on success `take` gives it back once the rows are decoded
            if isinstance(exc, ReadIncomplete):
                raise ChunksUnavailable(f"{where}: its chunks from {aside.first.describe()}: {exc}") from None
            raise
        finally:
            if isinstance(records, Generator):
                records.close()  # its consumer now, not when the traceback lets go of it
        return assembly

    def _reread_one(self, assembly: Assembly, built: BatchBuilt, found: Record) -> None:
        if found.key != built.batch_id.encode() or not found.value:
            return  # chunks are keyed by their batch id
        try:
            event = decode(found.value)
        except DecodeError:
            return  # dead-lettered when it was first read
        if not isinstance(event, BatchRows) or (event.batch_id, event.rows_sha256) != (
            built.batch_id,
            built.rows_sha256,
        ):
            return
        try:
            if not self._fits(assembly, event, found):
                return
        except Refused as refused:
            if refused.error_type == "BatchTooLarge":
                raise
            return  # a chunk that disagrees was dead-lettered when it was first read
        self._make_room(len(found.value), slots=0)
        self._store(assembly, event.index, found)

    def _verified(self, assembly: Assembly | None, built: BatchBuilt, where: str) -> list[dict[str, Any]]:
        if assembly is None:
            forgotten = (
                f" (or they were set aside and forgotten: {self.forgotten} batches so far, past "
                f"{self.max_set_aside} set aside)"
                if self.forgotten
                else ""
            )
            raise Refused(
                f"{where}: none of its {built.chunks} batch.rows chunks with rows_sha256 "
                f"{built.rows_sha256!r} came before it{forgotten}",
                "MissingChunks",
            )
        missing = sorted(set(range(built.chunks)) - set(assembly.parts))
        if assembly.chunks != built.chunks or missing:
            raise Refused(
                f"{where}: chunks {built.chunks}, missing {missing or 'none'}; {assembly.describe()}",
                "MissingChunks",
            )
        rows = [row for index in range(built.chunks) for row in decode(assembly.parts[index]).rows]
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
        """Per partition, the offset of the first chunk of a batch still being assembled (open or
        set aside)."""
        held: dict[Partition, int] = {}
        for assembly in (*self.open.values(), *self.aside.values()):
            tp = assembly.partition
            held[tp] = min(held.get(tp, assembly.first.offset), assembly.first.offset)
        return held


class LogReader:
    """`Reread` over the broker: a partition's records between two offsets, with a consumer of its
    own (no group, nothing committed), closed after each read. A read that does not get there in
    `timeout_s` raises `ReadIncomplete` (the assembler makes it `ChunksUnavailable`); generous, since
    a flood between a batch's chunks and its `batch.built` lengthens the read and the restart would
    read the same range again."""

    def __init__(self, bootstrap_servers: str, timeout_s: float = 300.0):
        self.bootstrap_servers, self.timeout_s = bootstrap_servers, timeout_s

    def __call__(self, topic: str, partition: int, start: int, stop: int) -> Iterator[Record]:
        consumer = make_consumer(self.bootstrap_servers, CLIENT_ID)
        try:
            parts = [tp for tp in topic_partitions(consumer, [topic]) if tp.partition == partition]
            if not parts:
                raise ReadIncomplete(f"{topic}[{partition}]: the broker does not know this partition")
            records = iter_range(consumer, parts, {parts[0]: start}, timeout_s=self.timeout_s, strict=True)
            for record in records:
                if record.offset >= stop:
                    return
                yield record
        finally:
            consumer.close()

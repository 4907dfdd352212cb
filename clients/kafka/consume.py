"""The consume -> handle -> write -> dead-letter -> commit loop every consuming stage runs.

One cycle: poll -> `handler.handle(record)` for each record (a record it cannot take becomes a dead
letter with its coordinates) -> `handler.write(...)` makes durable what is due -> the dead letters
are acknowledged -> the offsets `handler.commit_positions(...)` allows are committed. Nothing is
committed before what it covers is written, so a kill -9 anywhere re-delivers from the last commit
and loses nothing acknowledged.

What is poison (the record's fault, the same on every replay) versus an outage (the broker, the
disk, the device: raised, the process exits and the record is read again) is decided by
`clients.kafka.poison.is_poison`, which the stream roles' batch shell uses too; `refusal` turns a
poison into a letter's reason.

The same steps run over either client: `ConsumeLoop.run` cycles a kafka-python consumer (the
trainer consumer, the executor), `ConsumeLoop.run_async` an aiokafka one (the sink). Under
`run_async` a handler's `write` may be a coroutine: the sink starts a batch's insert on a thread and
returns, and offers its offsets in `commit_positions` only once the insert is durable, so the next
batch is polled and decoded while the previous one is written. An aiokafka group member subscribed
with `ConsumeLoop.subscribe` writes and commits everything consumed before its partitions move to
another member. A handler that refuses rows at write time (the sink: a row the table will not
take) publishes their letters with `clients.kafka.dead_letters` inside that write, before it
counts as durable; so every dead letter is acknowledged before the offset that covers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from clients.kafka.dead_letters import letter_for, publish_dead_letters
from clients.kafka.poison import is_poison
from clients.kafka.ranges import as_record, topic_partitions
from schemas.errors import DecodeError
from schemas.events import DeadLetter
from schemas.records import Record

log = logging.getLogger(__name__)

Partition = tuple[str, int]


class Refused(Exception):
    """Raised by a handler for a record it can never take; becomes a dead letter with `reason`."""

    def __init__(self, reason: str, error_type: str = ""):
        super().__init__(reason)
        self.reason, self.error_type = reason, error_type or "Refused"


class RecordHandler(Protocol):
    """What a stage plugs into the loop."""

    def handle(self, record: Record, now: float) -> None:
        """Take one record (buffer it, or act on it). Raise `Refused` (or any poison) to refuse it."""

    def write(self, now: float, force: bool) -> bool:
        """Make durable what is due (everything when `force`); True when something was written.
        Under `run_async` it may be a coroutine (a pipelined write: start it, finish it later)."""

    def commit_positions(self, consumed: dict[Partition, int]) -> dict[Partition, int]:
        """Of the positions consumed, what may be committed now (held back by pending work, or by a
        write not yet durable). A partition the loop no longer consumes is dropped from the answer."""


def refusal(exc: BaseException, refused: str) -> tuple[str, str] | None:
    """The reason and error type of a dead letter for a record whose handling raised `exc`; None
    when `exc` is an outage (re-raise it). `refused` starts the reason of an unexpected poison.

    >>> refusal(KeyError("prompt"), "no rows"), refusal(ConnectionError(), "no rows")
    (("no rows: KeyError('prompt')", 'KeyError'), None)
    """
    if isinstance(exc, Refused):
        return exc.reason, exc.error_type
    if isinstance(exc, DecodeError):
        return exc.reason, "DecodeError"
    if not is_poison(exc):
        return None
    return f"{refused}: {exc!r}", type(exc).__name__


@dataclass(frozen=True)
class LoopConfig:
    """How one stage runs the loop."""

    stage: str  # names its dead letters and log lines
    refusal: str = "cannot handle this record"  # starts the reason of an unexpected poison
    poll_timeout_ms: int = 500
    max_records: int | None = None
    idle_exit_s: float | None = None  # exit once nothing came and nothing was due this long
    write_all_on_stop: bool = False  # on stop, write and commit everything consumed (else replay it)


class ConsumeLoop:
    """One stage's loop over a consumer the caller created and assigned (or subscribed)."""

    def __init__(self, consumer, producer, handler: RecordHandler, config: LoopConfig):
        self.consumer, self.producer, self.handler, self.config = consumer, producer, handler, config
        self.consumed: dict[Partition, int] = {}
        self.committed: dict[Partition, int] = {}
        self.dead: list[DeadLetter] = []
        self.dead_lettered = 0  # letters published so far
        self.failure: BaseException | None = None  # raised in a rebalance callback; nothing commits
        self.aio = False  # an aiokafka consumer (`run_async`) or a kafka-python one (`run`)
        # aiokafka runs a rebalance callback (`subscribe`'s drain) while the cycle awaits: one of
        # them at a time takes, writes and commits
        self.steps: asyncio.Lock | contextlib.nullcontext = contextlib.nullcontext()

    # --- the steps, shared by both clients ----------------------------------------------------------

    def take(self, record: Record, now: float) -> None:
        """Hand one record to the handler; a refused one becomes a dead letter."""
        self.consumed[(record.topic, record.partition)] = record.offset + 1
        try:
            self.handler.handle(record, now)
        except Exception as exc:
            refused = refusal(exc, self.config.refusal)
            if refused is None:
                raise
            self.refuse(record, *refused)

    def take_all(self, polled: dict, now: float) -> bool:
        """Take every message of one poll; True when there was one. Messages of a partition that
        moved to another member while they were being returned are left to it (not committed here)."""
        owned = self.consumer.assignment() if self.aio else None
        for tp, batch in polled.items():
            if owned is not None and tp not in owned:
                continue
            for message in batch:
                self.take(as_record(message), now)
        return bool(polled)

    def refuse(self, record: Record, reason: str, error_type: str) -> None:
        log.warning("%s: refusing %s: %s", self.config.stage, record.describe(), reason[:500])
        self.dead.append(letter_for(self.config.stage, record, reason, error_type))

    def due_commits(self) -> dict[Partition, int]:
        """What to commit now: the handler's positions of partitions still consumed, not committed."""
        if self.failure is not None:
            raise self.failure
        positions = self.handler.commit_positions(dict(self.consumed))
        return {
            tp: off for tp, off in positions.items() if tp in self.consumed and self.committed.get(tp) != off
        }

    def publish_dead(self) -> int:
        dead, self.dead = self.dead, []
        publish_dead_letters(self.producer, dead)
        self.dead_lettered += len(dead)
        return len(dead)

    def released(self, partitions: Iterable[Partition]) -> None:
        """Forget `partitions` (moved to another group member): nothing more is committed for them."""
        for tp in partitions:
            self.consumed.pop(tp, None)

    def idle_over(self, polled: bool, last_input: float, written: bool, now: float) -> bool:
        """Nothing came, nothing was due, for `idle_exit_s`."""
        idle = self.config.idle_exit_s
        return idle is not None and not polled and not written and now - last_input >= idle

    # --- the cycle: one coroutine for both clients -------------------------------------------------

    def run(self, stop: Callable[[], bool]) -> None:
        """Cycle a kafka-python consumer until `stop()` (or idle exit); raises on an outage (nothing
        uncommitted is lost). Every step it awaits is synchronous, so the cycle never suspends."""
        self.aio = False
        _complete(self.cycle(stop))

    async def run_async(self, stop: Callable[[], bool]) -> None:
        """`run` for a started aiokafka consumer: the event loop keeps fetching and heartbeating while
        a pipelined handler writes."""
        self.aio, self.steps = True, asyncio.Lock()
        await self.cycle(stop)

    async def cycle(self, stop: Callable[[], bool]) -> None:
        last_input = time.monotonic()
        while not stop():
            polled = await self.poll()
            async with self.steps:
                now = time.monotonic()
                took = self.take_all(polled, now)
                last_input = now if took else last_input
                written = await self.write(now, False)
                await self.settle()
                if self.idle_over(took, last_input, written, now):
                    if not await self.write(now, True):
                        log.info("%s: idle with nothing due, exiting", self.config.stage)
                        return
                    await self.settle()
        if self.config.write_all_on_stop:
            await self.drain()

    async def poll(self) -> dict:
        options = {"max_records": self.config.max_records} if self.config.max_records else {}
        if self.aio:
            return await self.consumer.getmany(timeout_ms=self.config.poll_timeout_ms, **options)
        return self.consumer.poll(timeout_ms=self.config.poll_timeout_ms, **options)

    async def write(self, now: float, force: bool) -> bool:
        written = self.handler.write(now, force)
        return bool(await written) if inspect.isawaitable(written) else written

    async def settle(self) -> None:
        """Dead letters acknowledged, then the commit. The positions are taken first: a write that
        becomes durable meanwhile (on another thread) commits at the next settle, after its letters."""
        changed = self.due_commits()
        if self.aio and self.dead:  # a kafka-python producer waits for its acks: not on the event loop
            await asyncio.to_thread(self.publish_dead)
        else:
            self.publish_dead()
        if changed:
            await self.commit(changed)
            self.committed.update(changed)

    async def commit(self, positions: dict[Partition, int]) -> None:
        if self.aio:
            from aiokafka.structs import TopicPartition

            await self.consumer.commit({TopicPartition(*tp): o for tp, o in positions.items()})
            return
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        self.consumer.commit(
            {TopicPartition(*tp): OffsetAndMetadata(o, "", -1) for tp, o in positions.items()}
        )

    async def drain(self) -> None:
        """Write everything consumed and commit it (on stop, and before partitions move)."""
        async with self.steps:
            await self.write(time.monotonic(), True)
            await self.settle()

    def subscribe(self, topics: Iterable[str]) -> None:
        """Join the aiokafka consumer's group for `topics`; before partitions move to another member,
        everything consumed is written and committed."""
        self.consumer.subscribe(topics=list(topics), listener=_commit_on_revoke(self))


def _commit_on_revoke(loop: ConsumeLoop):
    from aiokafka import ConsumerRebalanceListener
    from aiokafka.errors import KafkaError

    class CommitOnRevoke(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked):
            try:
                await loop.drain()
            except KafkaError as exc:
                # written; the next owner re-reads the uncommitted records (writes must be idempotent)
                log.warning("%s: commit on revocation failed (%s)", loop.config.stage, exc)
            except Exception as exc:  # aiokafka only logs a listener's error: keep it for the loop
                log.error("%s: write on revocation failed: %r", loop.config.stage, exc)
                loop.failure = loop.failure or exc
            finally:
                loop.released((tp.topic, tp.partition) for tp in revoked)

        async def on_partitions_assigned(self, assigned):
            log.info("%s: assigned %d partitions", loop.config.stage, len(assigned))

    return CommitOnRevoke()


def assign_from_committed(consumer, topics: list[str], rewind: tuple[str, ...] = ()) -> dict[Partition, int]:
    """Assign every partition of `topics` to a kafka-python consumer (no group rebalancing), each at
    its group's committed offset (the reset policy where there is none); `rewind` topics from the
    beginning. Returns the committed offsets found."""
    parts = topic_partitions(consumer, topics)
    consumer.assign(parts)
    found: dict[Partition, int] = {}
    for tp in parts:
        if tp.topic in rewind:
            consumer.seek_to_beginning(tp)
            continue
        committed = consumer.committed(tp)
        if committed is not None:
            consumer.seek(tp, committed)
            found[(tp.topic, tp.partition)] = committed
    log.info("assigned %d partitions of %s", len(parts), ", ".join(topics))
    return found


def _complete(coroutine):
    """Run a coroutine that never suspends (the kafka-python cycle: every step it awaits returns at
    once) to its end, without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("a kafka-python ConsumeLoop awaited I/O: an async handler needs run_async")

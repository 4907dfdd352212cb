"""The one batch shell every stream role runs in: consume a batch, check continuity, process
purely, publish, stage state, commit.

Batches come straight from the consumer (`consume_in_batches`: each fetch, at most `batch_max`
messages at a time, through streams/faust_compat.py `deliver_in_batches`, bypassing faust's
per-event stream; the rules and the assembler), or from a faust stream
(`consume`: `stream.take_events(batch_max, within=batch_within_s)`; the judge, whose batches
wait for slow calls). Per batch, under the role's lock:

1. continuity: a batch that follows offsets this worker never received exits the role before faust
   acks it (streams/offsets.py), unless retention deleted those offsets;
2. process: the role's pure function turns the records into a `BatchResult` (streams/batch.py);
   when that (or encoding its outputs) raises for a reason that is not the world's (`is_retryable`),
   the batch is processed again one record at a time, each published on its own, and a record that
   fails alone is dead-lettered with its coordinates (poison): one record never stops a role;
3. publish: outputs, forwards and dead letters are sent in bulk and awaited until acknowledged;
4. stage state: the changelog records of the table updates are sent and acknowledged, then the
   local store is written (faust's own table writes go through a buffer its pre-commit flush gives
   up on after 0.1 s, so offsets could be committed before the state they cover was stored);
5. commit: faust acks the batch after this returns and commits its offsets once its producer is
   flushed.

So after a crash (even kill -9) the worst case is reprocessing a batch: every output then carries
the same event id and bytes as before, which all consumers drop by event id. A batch that fails
(an output never acknowledged, a cancelled await) exits the process with `EXIT_REPLAY` instead of
letting faust commit past it; the supervisor restarts the role from the committed offsets. Timers
(`tick`) go through the same publish path and the same lock, so a timer never interleaves with a
batch. Every faust internal is reached through streams/faust_compat.py.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from functools import partial

from schemas.codec import encode, encode_key
from schemas.deadletter import dead_letter
from schemas.limits import MAX_EVENT_BYTES
from schemas.records import Record
from schemas.topics import topic_for
from streams import faust_compat
from streams.batch import STATE, BatchPacing, BatchResult, is_retryable, poison_letter
from streams.config import EXIT_REPLAY
from streams.dlq import send_dead_letters
from streams.errors import BatchFailed, OutputTooLarge
from streams.offsets import OffsetContinuity, OffsetGap
from streams.produce import send_all

log = logging.getLogger(__name__)

BATCH_STOP_GRACE_S = 10.0  # how long a stopping agent lets its batch finish

Process = Callable[[list[Record]], BatchResult | Awaitable[BatchResult]]
Work = Callable[[], BatchResult | Awaitable[BatchResult]]
Messages = list[tuple[str, bytes | None, bytes | None]]


class BatchShell:
    """One role's I/O: its tables, its optional internal topic for forwards, its lock and stats."""

    def __init__(
        self,
        app,
        name: str,
        partitions: int,
        tables: dict[str, str] | None = None,
        forget: Callable[[], None] = lambda: None,
    ):
        """`tables`: the role's table names in `BatchResult.tables` -> faust table names (which name
        the changelog topics, so they stay as they are); default one table, `state`. `forget`: drop
        the role's decoded-state caches (a batch that raised midway may have changed them in place
        without storing them)."""
        self.app, self.name, self.forget = app, name, forget
        tables = tables or {STATE: STATE}
        self.tables = {key: state_table(app, name, table, partitions) for key, table in tables.items()}
        self.forward_topic = None
        self.lock = asyncio.Lock()
        self.stats = BatchStats(name)

    def source(self, *topics: str):
        """A faust topic over `topics`, raw bytes in (records are decoded by the role)."""
        return self.app.topic(
            *topics, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        )

    def internal_topic(self, suffix: str, partitions: int):
        """The role's own topic `<app id>-<suffix>` for `BatchResult.forwards` (faust creates it)."""
        self.forward_topic = self.app.topic(
            f"{self.app.conf.id}-{suffix}",
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=partitions,
            internal=True,
        )
        return self.forward_topic

    def store(self, table: str = STATE):
        """A table's local store (raw keys to raw values): what a role's pure function reads."""
        return faust_compat.table_store(self.tables[table])

    def get(self, table: str = STATE) -> Callable[[bytes], bytes | None]:
        """The raw-state getter a role's pure function reads through."""
        return self.store(table).get

    async def consume(
        self, stream, batch_max: int, within_s: float, process: Process, name: str = ""
    ) -> None:
        """The body of a faust agent: every batch of `stream` through `process`, published."""
        name = name or self.name
        continuity = OffsetContinuity()
        async for events in stream.take_events(batch_max, within=within_s):
            messages = [event.message for event in events]
            await finish_batch(name, partial(self._batch, name, messages, process, continuity))

    def consume_in_batches(
        self, source, batch_max: int, process: Process, name: str = "", pace_s: float = 0.0
    ) -> None:
        """Every fetch of `source`'s topics through `process`, at most `batch_max` messages at a time,
        straight from the consumer: no per-event stream (a batch is what one fetch brought, so it
        grows with the load). Under load the next fetch is taken at most every `pace_s`
        (`BatchPacing`: none at a trickle). Each message is acked once its batch is published. The
        role's agent must still subscribe to `source` and run `hold`."""
        name = name or self.name
        continuity = OffsetContinuity()
        pacing = BatchPacing(pace_s)

        async def handle(messages: list) -> None:
            started = time.monotonic()
            for start in range(0, len(messages), batch_max):
                chunk = messages[start : start + batch_max]
                await finish_batch(name, partial(self._batch, name, chunk, process, continuity))
                for message in chunk:
                    faust_compat.ack(self.app, message)
            pause = pacing.pause(len(messages), started, time.monotonic())
            if pause > 0:
                await asyncio.sleep(pause)  # the fetcher keeps reading meanwhile: the next batch grows

        faust_compat.deliver_in_batches(self.app, source.topics, handle)

    def size_fetches(self, min_bytes: int, max_wait_ms: int, idle_wait_ms: int = 0) -> None:
        """A fetch, and so a batch under `consume_in_batches`, waits for `min_bytes` or `max_wait_ms`;
        once they return nothing, for the first byte or `idle_wait_ms` (clients/fetch_pacing.py)."""
        if min_bytes > 1:
            faust_compat.set_fetch_size(self.app, min_bytes, max_wait_ms, idle_wait_ms)

    async def hold(self, stream) -> None:
        """The body of an agent under `consume_in_batches`: it keeps faust's subscription, recovery
        and acks for the topics and receives nothing. A message reaching it would be acked by the
        stream without being processed, so that exits instead."""
        async for event in stream:
            exit_without_committing(
                self.name, BatchFailed(f"{event.message.topic}: message bypassed the batch path")
            )

    async def _batch(self, name: str, messages, process: Process, continuity: OffsetContinuity) -> None:
        await check_continuity(self.app, name, messages, continuity)
        records = [_record(message) for message in messages]
        async with self.lock:
            self.stats.first(len(records))
            started = time.perf_counter()
            try:
                result = await _maybe_await(process(records))
                messages = self._messages(result)
            except Exception as exc:
                if is_retryable(exc):
                    raise
                result = await self._one_by_one(name, records, process, exc)
                self.stats.add(len(records), len(result.outputs), time.perf_counter() - started, 0.0)
                return
            processed = time.perf_counter()
            await self._send(result, messages)
        self.stats.add(
            len(records), len(result.outputs), processed - started, time.perf_counter() - processed
        )

    async def tick(self, work: Work) -> BatchResult:
        """A timer's work (a grace period, a flush), published like a batch; a failure exits."""

        async def run() -> BatchResult:
            async with self.lock:
                result = timer_outputs_that_fit(self.name, await _maybe_await(work()))
                await self.publish(result)
                return result

        return await finish_batch(f"{self.name} timer", run)

    async def _one_by_one(self, name: str, records: list[Record], process: Process, exc: Exception):
        """A batch whose processing raised: each record processed and published alone, in order (so
        each sees the state of those before it); one that raises alone is poison and dead-lettered.
        A retryable failure, here too, exits as any failed batch does. Returns the results merged."""
        log.error(
            "%s: a batch of %d records (%s..%s) failed (%r); processing them one at a time",
            name,
            len(records),
            records[0].describe(),
            records[-1].describe(),
            exc,
        )
        merged = BatchResult()
        self.forget()
        for record in records:
            try:
                result = await _maybe_await(process([record]))
                messages = self._messages(result)
            except Exception as exc:
                if is_retryable(exc):
                    raise
                self.forget()
                result = BatchResult(dead=[poison_letter(name, record, exc)])
                messages = []
            await self._send(result, messages)
            merged.outputs += result.outputs
            merged.dead += result.dead
        return merged

    async def publish(self, result: BatchResult) -> None:
        """Outputs, forwards and dead letters (acknowledged), then the state: the changelog never
        runs ahead of what was emitted."""
        await self._send(result, self._messages(result))

    def _messages(self, result: BatchResult) -> Messages:
        """The outputs and forwards, encoded (an output that cannot be encoded, or that with the
        batch's state values would not fit in a message, raises here, before anything is sent)."""
        messages = [(topic_for(e.type), encode_key(e), encode(e)) for e in result.outputs]
        if result.forwards:
            if self.forward_topic is None:
                raise BatchFailed(f"{self.name}: forwards without an internal topic")
            topic = self.forward_topic.get_topic_name()
            messages += [(topic, key, value) for key, value in result.forwards]
        check_sizes(messages, result.tables)
        return messages

    async def _send(self, result: BatchResult, messages: Messages) -> None:
        await send_all(self.app, messages)
        await send_dead_letters(self.app, self.name, result.dead)
        await self._store(result.tables)

    async def _store(self, updates: dict[str, dict[bytes, bytes | None]]) -> None:
        changelog = []
        for table_name, changes in updates.items():
            topic = self.tables[table_name].changelog_topic.get_topic_name()
            changelog += [(topic, key, value) for key, value in changes.items()]
        await send_all(self.app, changelog)
        for table_name, changes in updates.items():
            store = self.store(table_name)
            for key, value in changes.items():
                if value is None:
                    store.pop(key, None)
                else:
                    store[key] = value


def check_sizes(messages: Messages, tables: dict[str, dict[bytes, bytes | None]]) -> None:
    """Refuse an output or a state value that one Kafka message cannot hold: the broker would refuse
    it at every replay (MessageSizeTooLarge, a crash loop), so the record behind it is poison.

    >>> check_sizes([("t", b"k", b"x" * (MAX_EVENT_BYTES + 1))], {})
    Traceback (most recent call last):
    ...
    streams.errors.OutputTooLarge: an output to t of 1000001 bytes is over the 1000000 one message may hold
    """
    outputs = ((f"an output to {topic}", value) for topic, _, value in messages)
    states = (
        (f"a value of the {table} table", value)
        for table, changes in tables.items()
        for value in changes.values()
    )
    for what, value in itertools.chain(outputs, states):
        if value is not None and len(value) > MAX_EVENT_BYTES:
            raise OutputTooLarge(
                f"{what} of {len(value)} bytes is over the {MAX_EVENT_BYTES} one message may hold"
            )


def timer_outputs_that_fit(stage: str, result: BatchResult) -> BatchResult:
    """A timer's outputs (a grace period emitting what it has) come from no record that could be
    dead-lettered instead: one that no message can hold goes to the DLQ itself, as a bounded summary
    keyed by its trajectory, and the others are published (raising would exit and loop on it)."""
    kept = []
    for event in result.outputs:
        data = encode(event)
        if len(data) <= MAX_EVENT_BYTES:
            kept.append(event)
            continue
        reason = f"a {event.type} of {len(data)} bytes is over the {MAX_EVENT_BYTES} one message may hold"
        log.error("%s: %s (trajectory %s): dead-lettered", stage, reason, event.trajectory_id)
        result.dead.append(
            dead_letter(stage, reason, data, key=encode_key(event), error_type="OutputTooLarge")
        )
    result.outputs = kept
    return result


def state_table(app, role: str, table: str, partitions: int):
    """A changelog-backed table of raw bytes (changelog `agentstream-<role>-<table>-changelog`)."""
    return app.Table(
        table,
        default=None,
        key_type=bytes,
        value_type=bytes,
        partitions=partitions,
        use_partitioner=True,  # changelog partition from the key, as for the source topics
        help=f"{table} of processor {role}",
    )


async def _maybe_await(value):
    return await value if inspect.isawaitable(value) else value


def _record(message) -> Record:
    return Record(message.topic, message.partition, message.offset, message.key, message.value)


class BatchStats:
    """Per-role counters, logged every `every_s` seconds (events, batches, time per phase)."""

    def __init__(self, name: str, every_s: float = 10.0):
        self.name, self.every_s = name, every_s
        self.started = False
        self.reset(time.monotonic())

    def reset(self, now: float) -> None:
        self.since, self.events, self.batches, self.outputs = now, 0, 0, 0
        self.busy_process = self.busy_send = 0.0

    def first(self, events: int) -> None:
        if not self.started:
            self.started = True
            log.info("%s: first batch: %d events", self.name, events)

    def add(self, events: int, outputs: int, process_s: float, send_s: float) -> None:
        self.events += events
        self.batches += 1
        self.outputs += outputs
        self.busy_process += process_s
        self.busy_send += send_s
        now = time.monotonic()
        if now - self.since >= self.every_s:
            log.info(
                "%s: %d events in %d batches (%.0f/s), %d outputs; busy %.1fs processing, %.1fs sending",
                self.name,
                self.events,
                self.batches,
                self.events / (now - self.since),
                self.outputs,
                self.busy_process,
                self.busy_send,
            )
            self.reset(now)


async def check_continuity(app, name: str, messages, continuity: OffsetContinuity) -> None:
    """Exit before acking a batch that follows offsets this worker never received.

    A gap is accepted only when retention deleted those offsets (the log now starts after them)."""
    committed = faust_compat.committed_offsets(app)
    gaps = continuity.check(
        ((m.generation_id, m.topic, m.partition, m.offset) for m in messages),
        lambda topic, partition: committed.get((topic, partition)),
    )
    for gap in gaps:
        if not await _deleted_by_retention(app, gap):
            exit_without_committing(name, BatchFailed(f"never received {gap.describe()}"))
        log.warning("%s: %s were deleted by retention before they were processed", name, gap.describe())


async def _deleted_by_retention(app, gap: OffsetGap) -> bool:
    from faust.types import TP

    tp = TP(gap.topic, gap.partition)
    try:
        earliest = (await app.consumer.earliest_offsets(tp)).get(tp)
    except Exception as exc:  # the broker is unreachable: do not guess
        log.warning("could not read the log start of %s[%d]: %r", gap.topic, gap.partition, exc)
        return False
    return earliest is not None and earliest >= gap.got


async def finish_batch(name: str, work):
    """Await `work()` (one batch: outputs sent and acknowledged, then state) and return its result,
    or exit without committing.

    A failure exits at once (`exit_without_committing`). A cancellation (faust stopping the agent)
    lets the batch finish first, for at most BATCH_STOP_GRACE_S, so that a graceful stop does not
    leave a half-sent batch to be acked, nor replay a finished one; then the cancellation goes on."""
    task = asyncio.ensure_future(work())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), BATCH_STOP_GRACE_S)
            except BaseException as exc:
                exit_without_committing(name, exc)
        if task.cancelled() or task.exception() is not None:
            exit_without_committing(name, task.exception() or asyncio.CancelledError())
        raise
    except BaseException as exc:
        exit_without_committing(name, exc)


def exit_without_committing(name: str, exc: BaseException) -> None:
    """A batch failed (a send that never got its acknowledgement, a cancelled await): exit now.

    faust's `take_events` acks a batch in a `finally`, also when processing raised, and its commit
    timer would then commit offsets whose outputs were never acknowledged (lost rewards after a
    broker restart, seen in the system fault test). Exiting at once commits nothing more; the batch
    is consumed again after the restart and re-sent with the same event ids."""
    log.critical("%s: batch failed (%r); exiting without committing it", name, exc)
    logging.shutdown()
    os._exit(EXIT_REPLAY)

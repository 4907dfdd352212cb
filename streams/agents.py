"""Thin faust agents around the batch processors (streams/processors.py): I/O only.

Per batch (`stream.take_events(batch_max, within=batch_within_s)`): hand the raw records to the
processor, send its outputs and dead letters in bulk and wait for their acknowledgements, then write
the state updates to the table (one changelog record per trajectory per batch). faust acks the
batch's events after this coroutine returns and flushes its producer before committing offsets,
so after a crash (even kill -9) the worst case is reprocessing a batch: every output then carries
the same event_id and the same bytes as before, which all consumers drop by event_id.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from functools import partial

from schemas.codec import encode, encode_key
from schemas.events import EventBase
from schemas.topics import topic_for
from streams.config import EXIT_REPLAY, WorkerConfig
from streams.dlq import send_dead_letters
from streams.offsets import OffsetContinuity, OffsetGap
from streams.processors import BatchResult, Record, RuleRewarder, TrajectoryAssembler
from streams.produce import send_all
from streams.rules.profiles import ProfileRegistry

log = logging.getLogger(__name__)


class BatchStats:
    """Per-processor counters, logged every `every_s` seconds (events, batches, time per phase)."""

    def __init__(self, name: str, every_s: float = 10.0):
        self.name, self.every_s = name, every_s
        self.started = False
        self.reset(time.monotonic())

    def reset(self, now: float) -> None:
        self.since, self.events, self.batches, self.outputs, self.busy_process, self.busy_send = (
            now,
            0,
            0,
            0,
            0.0,
            0.0,
        )

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


async def run_batch(app, table, processor, events, stats: BatchStats, continuity: OffsetContinuity) -> None:
    if not stats.started:
        stats.started = True
        log.info("%s: first batch: %d events", processor.name, len(events))
    await check_continuity(app, processor.name, events, continuity)
    t0 = time.perf_counter()
    result = processor.process(_records(events), table.get)
    t1 = time.perf_counter()
    await apply_result(app, table, processor.name, result)
    stats.add(len(events), len(result.outputs), t1 - t0, time.perf_counter() - t1)


async def check_continuity(app, name: str, events, continuity: OffsetContinuity) -> None:
    """Exit before acking a batch that follows offsets this worker never received.

    A gap is accepted only when retention deleted those offsets (the log now starts after them)."""
    committed = app.consumer._committed_offset  # faust's view of the group's committed offsets
    gaps = continuity.check(
        ((e.message.generation_id, e.message.topic, e.message.partition, e.message.offset) for e in events),
        lambda topic, partition: committed.get((topic, partition)),
    )
    for gap in gaps:
        if not await _deleted_by_retention(app, gap):
            exit_without_committing(name, RuntimeError(f"never received {gap.describe()}"))
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


def _state_table(app, name: str, partitions: int):
    return app.Table(
        "state",
        default=None,
        key_type=bytes,
        value_type=bytes,
        partitions=partitions,
        use_partitioner=True,  # changelog partition from the key, as for the source topics
        help=f"per-trajectory state of processor {name}",
    )


def _source(app, processor):
    return app.topic(
        *processor.sources, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )


def _records(events) -> list[Record]:
    out = []
    for event in events:
        msg = event.message
        out.append(Record(msg.topic, msg.partition, msg.offset, msg.key, event.value))
    return out


async def send_events(app, events: list[EventBase]) -> None:
    """Send events to their topics (keyed by trajectory id) and wait until all are acknowledged."""
    await send_all(app, [(topic_for(e.type), encode_key(e), encode(e)) for e in events])


async def apply_result(app, table, stage: str, result: BatchResult) -> None:
    """Outputs first, then the state: the changelog never runs ahead of what was emitted.

    The changelog records are sent (and awaited) here rather than through `table[key] = value`,
    because faust's table writes go through a buffer that its pre-commit flush gives up on after
    0.1 s, so offsets could be committed before the state they cover was stored."""
    await send_events(app, result.outputs)
    await send_dead_letters(app, stage, result.dead)
    if result.updates:
        changelog = table.changelog_topic.get_topic_name()
        await send_all(app, [(changelog, key, value) for key, value in result.updates.items()])
        for key, value in result.updates.items():
            table.data[key] = value


def register_rules(app, config: WorkerConfig) -> None:
    profiles = ProfileRegistry.from_file(config.profiles_path)
    processor = RuleRewarder(profiles, config.reward_version)
    table = _state_table(app, processor.name, config.partitions)
    stats, continuity = BatchStats(processor.name), OffsetContinuity()

    @app.agent(_source(app, processor), name=processor.name)
    async def rules(stream):
        async for events in stream.take_events(config.batch_max, within=config.batch_within_s):
            batch = partial(run_batch, app, table, processor, events, stats, continuity)
            await finish_batch(processor.name, batch)


def register_assembler(app, config: WorkerConfig) -> None:
    profiles = ProfileRegistry.from_file(config.profiles_path)
    processor = TrajectoryAssembler(profiles, config.grace_seconds, judge_mode=judge_mode_function(config))
    table = _state_table(app, processor.name, config.partitions)
    lock = asyncio.Lock()
    stats, continuity = BatchStats(processor.name), OffsetContinuity()
    restored = {"done": False}

    @app.agent(_source(app, processor), name=processor.name)
    async def assembler(stream):
        async for events in stream.take_events(config.batch_max, within=config.batch_within_s):
            async with lock:
                _track_restored(processor, table, restored)
                batch = partial(run_batch, app, table, processor, events, stats, continuity)
                await finish_batch(processor.name, batch)  # under the lock: the grace timer waits

    @app.timer(config.timer_interval_s, name=f"{processor.name}-grace")
    async def grace():
        if not _recovered(app):
            return
        async with lock:
            _track_restored(processor, table, restored)
            result = processor.expire(table.get)
            if result.outputs:
                log.info("%s: grace period over for %d trajectories", processor.name, len(result.outputs))
            await apply_result(app, table, processor.name, result)


BATCH_STOP_GRACE_S = 10.0  # how long a stopping agent lets its batch finish


async def finish_batch(name: str, work) -> None:
    """Await `work()` (one batch: outputs sent and acknowledged, then state), or exit without
    committing.

    A failure exits at once (`exit_without_committing`). A cancellation (faust stopping the agent)
    lets the batch finish first, for at most BATCH_STOP_GRACE_S, so that a graceful stop does not
    leave a half-sent batch to be acked, nor replay a finished one; then the cancellation goes on."""
    task = asyncio.ensure_future(work())
    try:
        await asyncio.shield(task)
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


def _recovered(app) -> bool:
    recovery = getattr(app.tables, "recovery", None)
    completed = getattr(recovery, "completed", None)
    return completed is None or completed.is_set()


def _track_restored(processor: TrajectoryAssembler, table, restored: dict) -> None:
    if restored["done"]:
        return
    restored["done"] = True
    processor.started_at = processor.clock()  # grace periods of restored trajectories start now
    count = processor.track_restored(list(table.data.items()))
    log.info("%s: %d restored trajectories may still emit", processor.name, count)


def judge_mode_function(config: WorkerConfig):
    """`started -> judge mode or None`: whether the judge is expected to score a trajectory.

    Uses `streams.judge.selection.JudgeRules` with `config.judge_rules_path`; a missing module or no
    rules means the judge is never expected (the assembler then waits only for rule rewards)."""
    try:
        from streams.judge.selection import JudgeRules
    except ImportError:
        log.info("judge selection module not available: no judge scores expected")
        return lambda started: None
    rules = JudgeRules.load(config.judge_rules_path)
    if not rules.rules:
        return lambda started: None
    return rules.mode_for

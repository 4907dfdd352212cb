"""Every private faust access the stream processors make, in one place.

faust-streaming has no public API for a few things a correct shell needs; these helpers are the
only code that reaches into it, each naming what it touches. `CLASS_ATTRIBUTES` and
`INSTANCE_ATTRIBUTES` list every attribute relied on; tests/unit/streams/test_faust_compat.py
checks each exists on the installed faust, and `import_faust()` refuses (a clear
`FaustVersionError`) a faust series it was not written for, instead of running with patched
internals that may have moved.

What is reached, and why:
- `committed_offsets(app)`: the consumer's view of the group's committed offsets
  (`Consumer._committed_offset`), for the offset-continuity guard (streams/offsets.py).
- `aiokafka_producer(app)`: the aiokafka producer inside faust's (`Producer._ensure_producer`), so
  that streams/produce.py sends through it one record batch per partition with the project's one
  sender (clients/kafka/record_batches.py, which needs only the producer's public API).
- `table_store(table)`: a table's local store (`Table.data`), written after its changelog records
  are acknowledged (faust's own table writes go through a buffer its pre-commit flush gives up on).
- `recovery_completed(app)`: whether table recovery finished (`app.tables.recovery.completed`).
- `deliver_in_batches(app, topics, handler)`: the messages of `topics` go from each fetch straight to
  `handler(messages)`, in fetch order, instead of one by one through faust's conductor, channel queue,
  stream iterator and take buffer (with a `wait_first` task per message): that per-event path was
  about half of a role's CPU. Applied by wrapping `Consumer._drain_messages`, whose loop it keeps
  (read offsets, gaps, flow and generation checks in `getmany`, commit every N acks); every other
  message (table changelogs during recovery) still goes through faust's own callback. The handler
  acks each message (`Consumer.ack`) once its batch is published; a role's agent stays subscribed to
  the topics (so subscription, recovery and acks are faust's own) and receives nothing.
- Two fixes for a record-loss race in faust-streaming 0.15's recovery (its issue #596), applied by
  `import_faust()`:

  1. `Recovery.on_recovery_completed` resumes the stream partitions, then awaits the seek to the
     committed offsets, then calls `flow_control.resume()`, which clears every agent queue. Records
     the fetcher delivered during that await were wiped, and the read offset had already moved past
     them. Fixed by seeking first (the partitions are still paused) and resuming the partitions and
     the flow with no await in between.
  2. faust hands its live set of active partitions to the consumer thread, and aiokafka reads it
     only when the fetch returns; an empty set there means "every partition". A fetch in flight
     while recovery paused everything drained the stream partitions' prefetched records, which
     faust's paused-partition filter then dropped. Fixed by passing a snapshot taken at request
     time, and not fetching at all when it is empty.

  Measured with tests/integration/broker/test_broker_faust.py under CPU load: 9 failed restarts in
  54 without the fixes, 0 in 48 with both. The offset-continuity guard stays as the backstop.
"""

from __future__ import annotations

import asyncio
import logging

from clients.fetch_pacing import pace_fetches
from streams.errors import FaustVersionError

log = logging.getLogger(__name__)

SUPPORTED_SERIES = "0.15."  # pyproject pins faust-streaming 0.15.*

# (module:class, attribute): what this module relies on, checked on the installed faust by
# tests/unit/streams/test_faust_compat.py.
CLASS_ATTRIBUTES = (
    ("faust.tables.recovery:Recovery", "on_recovery_completed"),
    ("faust.tables.recovery:Recovery", "_set_recovery_ended"),
    ("faust.tables.recovery:Recovery", "_is_changelog_tp"),
    ("faust.tables.recovery:Recovery", "_wait"),
    ("faust.transport.drivers.aiokafka:AIOKafkaConsumerThread", "getmany"),
    ("faust.transport.drivers.aiokafka:Producer", "_ensure_producer"),
    ("faust.app.base:App", "_fetcher"),
    ("faust.transport.consumer:Consumer", "_drain_messages"),
    ("faust.transport.consumer:Consumer", "_add_gap"),
    ("faust.transport.consumer:Consumer", "ack"),
    ("faust.transport.drivers.aiokafka:AIOKafkaConsumerThread", "_create_worker_consumer"),
    ("faust.tables.base:Collection", "data"),
)
# (path from a constructed faust App, attribute): set in constructors, so checked on an instance.
INSTANCE_ATTRIBUTES = (
    ("consumer", "_committed_offset"),
    ("tables.recovery", "actives_for_table"),
    ("tables.recovery", "standbys_for_table"),
    ("tables.recovery", "completed"),
)
_applied = False


def import_faust():
    """faust, with the recovery fixes applied; `FaustVersionError` for another faust series."""
    global _applied
    import faust

    version = getattr(faust, "__version__", "")
    if not version.startswith(SUPPORTED_SERIES):
        raise FaustVersionError(
            f"faust-streaming {version or '(unknown version)'} is installed; the stream processors "
            f"were written for {SUPPORTED_SERIES}x (install faust-streaming=={SUPPORTED_SERIES}*)"
        )
    if not _applied:
        from faust.tables.recovery import Recovery
        from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

        Recovery.on_recovery_completed = _on_recovery_completed
        AIOKafkaConsumerThread.getmany = _snapshot_getmany(AIOKafkaConsumerThread.getmany)
        from faust.transport.consumer import Consumer

        Consumer._drain_messages = _batched_drain(Consumer._drain_messages)
        AIOKafkaConsumerThread._create_worker_consumer = _sized_fetches(
            AIOKafkaConsumerThread._create_worker_consumer
        )
        _applied = True
    return faust


def committed_offsets(app):
    """The group's committed offsets as faust's consumer knows them: {TP: offset}."""
    return app.consumer._committed_offset


def aiokafka_producer(app):
    """The aiokafka producer faust runs (one producer per worker; faust's pre-commit flush covers
    what is sent through it)."""
    return app.producer._ensure_producer()


def table_store(table):
    """A table's local store (a mutable mapping of raw keys to raw values)."""
    return table.data


def recovery_completed(app) -> bool:
    """True once table recovery finished (or when the app has no recovery to wait for)."""
    recovery = getattr(app.tables, "recovery", None)
    completed = getattr(recovery, "completed", None)
    return completed is None or completed.is_set()


async def _on_recovery_completed(self, generation_id: int = 0) -> None:
    """faust's `Recovery.on_recovery_completed` with the seek moved before the resume (fix 1)."""
    app, consumer = self.app, self.app.consumer
    self.log.info("Restore complete!")
    await app.on_rebalance_complete.send()
    self._set_recovery_ended()
    table_callbacks = [
        asyncio.ensure_future(
            table.on_recovery_completed(self.actives_for_table[table], self.standbys_for_table[table])
        )
        for table in self.tables.values()
    ]
    if table_callbacks:
        await asyncio.wait(table_callbacks)
    assignment = consumer.assignment()
    if _rebalancing_again(self, generation_id):
        return
    if assignment:
        self.log.info("Seek stream partitions to committed offsets (still paused).")
        await self._wait(consumer.perform_seek(), timeout=app.conf.broker_request_timeout)
        if _rebalancing_again(self, generation_id):
            return
    # No await from here to flow_control.resume(): nothing can be delivered and then cleared.
    consumer.resume_partitions({tp for tp in assignment if not self._is_changelog_tp(tp)})
    self.completed.set()
    app.flow_control.resume()
    consumer.resume_flow()
    await app._fetcher.maybe_start()
    self.tables.on_actives_ready()
    if not app.assignor.assigned_standbys():
        self.tables.on_standbys_ready()
    app.on_rebalance_end()
    self.log.info("Worker ready")


def _rebalancing_again(recovery, generation_id: int) -> bool:
    current = recovery.app.consumer_generation_id
    if current != generation_id:
        recovery.log.warning("Recovery rebalancing again (generation %s, not %s)", current, generation_id)
    return current != generation_id


def _snapshot_getmany(original):
    async def getmany(self, active_partitions, timeout: float):
        """Fetch for the partitions active now, not for whatever the set holds later (fix 2)."""
        if active_partitions is not None:
            active_partitions = frozenset(active_partitions)
            if not active_partitions:
                await asyncio.sleep(0)
                return {}
        return await original(self, active_partitions, timeout)

    return getmany


def set_fetch_size(app, min_bytes: int, max_wait_ms: int, idle_wait_ms: int = 0) -> None:
    """Fetches of `app`'s consumer are answered once `min_bytes` are ready or after `max_wait_ms`
    (faust passes neither to aiokafka). Under `deliver_in_batches` a fetch is a batch. With
    `idle_wait_ms`, the consumer's fetches are paced once it has started (clients/fetch_pacing.py)."""
    app._agentstream_fetch = (min_bytes, max_wait_ms, idle_wait_ms)


def _sized_fetches(create):
    def create_worker_consumer(self, transport):
        consumer = create(self, transport)
        sizing = getattr(self.app, "_agentstream_fetch", None)
        if sizing is not None:  # read by AIOKafkaConsumer.start(), which has not run yet
            if not hasattr(consumer, "_fetch_min_bytes"):
                log.warning("this aiokafka has no _fetch_min_bytes: fetches are not sized")
            min_bytes, max_wait_ms, idle_wait_ms = sizing
            consumer._fetch_min_bytes, consumer._fetch_max_wait_ms = min_bytes, max_wait_ms
            consumer.start = _paced_start(consumer, idle_wait_ms)
        return consumer

    return create_worker_consumer


def _paced_start(consumer, idle_wait_ms: int):
    start = consumer.start

    async def start_paced() -> None:
        await start()
        pace_fetches(consumer, idle_wait_ms)  # the fetcher exists once started

    return start_paced


def deliver_in_batches(app, topics, handler) -> None:
    """Hand the messages of `topics` (names) to `await handler(messages)` once per fetch (see the
    module docstring). Set before the worker starts; one handler per app."""
    app._agentstream_batches = (frozenset(topics), handler)


def ack(app, message) -> None:
    """Mark `message` processed: faust commits up to the acked offsets."""
    app.consumer.ack(message)


def _batched_drain(original):
    async def _drain_messages(self, fetcher) -> None:
        route = getattr(self.app, "_agentstream_batches", None)
        if route is None:
            return await original(self, fetcher)
        try:
            await _drain_in_batches(self, fetcher, *route)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                return
            raise

    return _drain_messages


async def _drain_in_batches(consumer, fetcher, topics: frozenset, handler) -> None:
    """faust's drain loop, with the messages of `topics` collected per fetch for `handler`."""
    callback = consumer.callback
    get_read_offset = consumer._read_offset.__getitem__
    set_read_offset = consumer._read_offset.__setitem__
    acks_enabled_for = consumer.app.topics.acks_enabled_for
    while not (consumer._stopped.is_set() or fetcher._stopped.is_set()):
        batch = []
        async for tp, message in consumer.getmany(timeout=1.0):
            offset, read = message.offset, get_read_offset(tp)
            if read is not None and offset < read:
                continue  # already delivered (faust drops these too)
            if read and offset - read > 1 and acks_enabled_for(message.topic):
                await consumer._add_gap(tp, read + 1, offset)
            if message.topic in topics:
                batch.append(message)
            else:
                await consumer.wait_first(callback(message), consumer.suspend_flow.wait())
            set_read_offset(tp, offset)
        if batch:
            await handler(batch)
        commit_every = consumer._commit_every
        if commit_every is not None and consumer._n_acked >= commit_every:
            consumer._n_acked = 0
            await consumer.commit()
        await asyncio.sleep(0)

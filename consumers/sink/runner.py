"""The sink worker: an aiokafka consumer group over every registry topic, into ClickHouse.

The loop is `clients.kafka.consume.ConsumeLoop.run_async` (the one the trainer consumer and the
executor run); `SinkHandler` is its handler: decode (schemas.codec) -> rows (consumers.sink.rows,
pure) -> ClickHouseSink buffer; write (insert, publish dead letters, and only then offer the offsets
that batch covered for commit) when
`batch_rows` rows are buffered, or every `flush_interval_s`, or, under light load (fewer than
`light_load_rows` buffered), already after `early_flush_s` once the previous insert is done. The
window adapts to the load: every insert costs ClickHouse a new part per table (about 9 ms of CPU in
chDB whatever its size), so under load the window stays long and the inserts grow instead of
multiplying, while at a trickle, where that cost is small in total, rows do not wait the full window.
Fetches wait for `fetch_min_bytes` (or `fetch_max_wait_ms`): a Kafka client spends far more per
fetch than per record, so following a live stream record by record costs several times the CPU.
Once fetches have returned nothing for a quarter of a second the next one waits for the first byte,
up to `fetch_idle_wait_ms` (clients/fetch_pacing.py), so an idle sink does not poll 20 times a second.

A crash at any point re-delivers from the last commit, and the tables deduplicate what was written
twice. Undecodable records and unwritable rows go to the DLQ topic (`stage="sink"`); dead letters
that arrive on the DLQ topic itself land in `dead_letters` (a broken record on the DLQ is written
there directly, never re-published, so there is no loop).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from clients.fetch_pacing import IDLE_WAIT_HELP, IDLE_WAIT_MS, max_wait_option, min_bytes_option, pace_fetches
from clients.kafka import ensure_topics, make_async_consumer, make_producer
from clients.kafka.consume import ConsumeLoop, LoopConfig, Partition, refusal
from clients.kafka.dead_letters import letter_for, publish_dead_letters
from clients.kafka.groups import commit_group_offsets, topic_offsets
from consumers.errors import ConsumerConfigError
from consumers.sink.clickhouse import ClickHouseSink
from consumers.sink.rows import dead_letter_row, rows_for
from schemas.codec import decode
from schemas.config_fields import check_bounds, option
from schemas.records import Record
from schemas.settings import DEFAULT_BOOTSTRAP
from schemas.topics import DLQ, TOPICS

log = logging.getLogger(__name__)

STAGE = "sink"
VERSIONS_SEEN = "trajectory_versions_seen"
GROUP_ID = "agentstream-sink"
REFUSAL = "no rows from this record"  # starts a dead letter's reason when rows_for raised


@dataclass(frozen=True)
class SinkConfig:
    """Everything `agentstream sink` needs (its options are generated from the fields with help)."""

    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    clickhouse_url: str = "chdb://.agentstream/clickhouse"
    group_id: str = option(GROUP_ID, "Kafka consumer group of the sink")
    topics: tuple[str, ...] = field(default_factory=lambda: tuple(TOPICS))
    batch_rows: int = option(
        20_000, "flush after this many buffered rows (bounds memory; the interval decides)", ge=1
    )
    flush_interval_s: float = option(0.5, "flush at least this often (seconds)", gt=0)
    early_flush_s: float = option(
        0.2, "under light load, flush after this long (seconds) once the writer is idle", ge=0
    )
    light_load_rows: int = option(
        200, "fewer rows than this buffered after --early-flush-s means light load", ge=0
    )
    fetch_min_bytes: int = min_bytes_option(256 * 1024)
    fetch_max_wait_ms: int = max_wait_option(50)
    fetch_idle_wait_ms: int = option(IDLE_WAIT_MS, IDLE_WAIT_HELP, ge=0)
    max_retry_s: float = option(300.0, "retry an unavailable ClickHouse this long, then exit 1", ge=0)
    from_beginning: bool = option(False, "rewind the group to offset 0 first (replay)")
    endpoint_port: int = option(0, "port of the HTTP endpoint serving an embedded chDB path")
    ready_file: Path | None = option(None, "write the ClickHouse URL readers should use once consuming")
    session_timeout_ms: int = 10_000

    def __post_init__(self):
        check_bounds(self, ConsumerConfigError)
        if self.early_flush_s > self.flush_interval_s:
            raise ConsumerConfigError(
                "--early-flush-s: must be between 0 and --flush-interval-s "
                f"({self.flush_interval_s!r}), got {self.early_flush_s!r}"
            )
        unknown = sorted(set(self.topics) - set(TOPICS))
        if unknown:
            raise ConsumerConfigError(f"topics: not in the registry: {unknown}")


@dataclass
class _InFlight:
    future: Future
    positions: dict[Partition, int]
    records: int
    rows: int


class SinkHandler:
    """The sink's handler in the consume loop (clients/kafka/consume.py): records -> buffered rows ->
    ClickHouse.

    Writes are pipelined: `write` starts a batch's insert on one writer thread (chDB and HTTP release
    the GIL) and returns, so the loop's event loop polls and decodes the next batch (and keeps the
    group's heartbeats going). At most one batch is in flight; its positions are offered to the loop
    for commit only once its insert and its write-time dead letters are durable.
    """

    def __init__(self, config: SinkConfig, client, producer):
        self.config = config
        self.sink = ClickHouseSink(client, max_retry_s=config.max_retry_s)
        self.producer = producer  # for the letters of rows the tables refuse
        self._positions: dict[Partition, int] = {}  # consumed since the last write started
        self._records = 0
        self._durable: dict[Partition, int] = {}  # written, not yet handed to the loop
        self._last_write = time.monotonic()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{STAGE}-writer")
        self._inflight: _InFlight | None = None
        # reward versions already buffered: `trajectory_versions_seen` keeps each one's first time, so
        # a row per trajectory would only add an insert (a part, ~3-9 ms of chDB CPU) to every flush
        self._versions_seen: set[tuple] = set()
        self.stats = {"records": 0, "rows": 0, "dead_letters": 0, "flushes": 0}

    def handle(self, record: Record, now: float) -> None:
        """Turn one record into buffered rows. One that gives none raises (the loop dead-letters
        it), unless it came from the DLQ itself: that is written to `dead_letters` directly, never
        re-published (no loop)."""
        self._positions[(record.topic, record.partition)] = record.offset + 1
        self._records += 1
        value = record.value or b""  # a tombstone is an empty, undecodable event
        try:
            event = decode(value)
            rows = rows_for(event, value, record.topic, record.partition, record.offset)
        except Exception as exc:
            refused = refusal(exc, REFUSAL) if record.topic == DLQ else None
            if refused is None:
                raise
            self.sink.add("dead_letters", dead_letter_row(letter_for(STAGE, record, *refused)), record)
            return
        for table, row in rows:
            if table == VERSIONS_SEEN:
                if row in self._versions_seen:
                    continue  # the table keeps the first time; this worker wrote it already
                self._versions_seen.add(row)
            self.sink.add(table, row, record)

    def due(self, now: float) -> bool:
        """Whether to start a write now: a full batch; rows waiting `flush_interval_s`; or, under light
        load, rows waiting `early_flush_s` while the writer is idle."""
        pending = self.sink.pending
        if pending >= self.config.batch_rows:
            return True
        if not self._positions:
            return False
        waited = now - self._last_write
        if waited >= self.config.flush_interval_s:
            return True
        light = pending < self.config.light_load_rows
        writer_idle = self._inflight is None or self._inflight.future.done()
        return light and writer_idle and waited >= self.config.early_flush_s

    async def write(self, now: float, force: bool) -> bool:
        """Collect a finished write; start the next one when due (after the previous one is durable).
        With `force`, write everything consumed and wait for it."""
        written = await self._collect(wait=force)
        if not (force or self.due(now)):
            return written
        self._last_write = now
        await self._collect(wait=True)
        if not self._positions:
            return written
        rows, records = self.sink.pending, self._records
        future = self._writer.submit(self._write, self.sink.take())
        self._inflight = _InFlight(future, self._positions, records, rows)
        self._positions, self._records = {}, 0
        if force:
            await self._collect(wait=True)
        return True

    def commit_positions(self, consumed: dict[Partition, int]) -> dict[Partition, int]:
        """The positions of the writes finished since the last call (the loop commits them now)."""
        durable, self._durable = self._durable, {}
        return durable

    async def _collect(self, wait: bool) -> bool:
        """Take the in-flight write's outcome once it is done (re-raising its failure here)."""
        inflight = self._inflight
        if inflight is None or (not wait and not inflight.future.done()):
            return False
        self._inflight = None
        self.stats["dead_letters"] += await asyncio.wrap_future(inflight.future)
        self._durable.update(inflight.positions)
        self.stats["records"] += inflight.records
        self.stats["rows"] += inflight.rows
        self.stats["flushes"] += 1
        return True

    def close(self) -> None:
        self._writer.shutdown(wait=True)

    # -- writer thread ------------------------------------------------------------------------

    def _write(self, batch) -> int:
        """Insert, then dead-letter the rows refused for good (acknowledged, or this raises and
        nothing is committed); returns the number of letters published."""
        dead, dlq_rows = [], {}
        for item in self.sink.write(batch):
            letter = letter_for(STAGE, item.source, item.reason, item.error_type)
            if item.source.topic == DLQ:
                rows, sources = dlq_rows.setdefault("dead_letters", ([], []))
                rows.append(dead_letter_row(letter))
                sources.append(item.source)
            else:
                dead.append(letter)
        for item in self.sink.write(dlq_rows) if dlq_rows else ():
            log.error(
                "dead letter from topic=%s partition=%d offset=%d could not be written either: %s",
                item.source.topic,
                item.source.partition,
                item.source.offset,
                item.reason,
            )
        publish_dead_letters(self.producer, dead)
        return len(dead)


def _consumer(config: SinkConfig):
    return make_async_consumer(
        config.bootstrap_servers,
        f"{config.group_id}-consumer",
        config.group_id,
        max_poll_records=config.batch_rows,
        fetch_min_bytes=config.fetch_min_bytes,
        fetch_max_wait_ms=config.fetch_max_wait_ms,
        session_timeout_ms=config.session_timeout_ms,
        heartbeat_interval_ms=max(1000, config.session_timeout_ms // 3),
    )


def rewind_group(config: SinkConfig) -> None:
    """Commit the first offset of every partition for the sink's group (a full replay on next start)."""
    beginnings = topic_offsets(config.bootstrap_servers, config.topics, "beginning")
    commit_group_offsets(config.bootstrap_servers, config.group_id, beginnings)
    log.info("rewound group %s to the beginning of %d partitions", config.group_id, len(beginnings))


def write_ready_file(path: Path, url: str) -> None:
    """Say, atomically, which ClickHouse URL readers should use (a supervisor or test waits on it)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(url)
    tmp.replace(path)


def run_until_signalled(config: SinkConfig) -> dict:
    """`agentstream sink`: run until SIGTERM / SIGINT; returns the sink's counters."""
    import signal

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def ready(url: str) -> None:
        log.info(
            "sink consuming %d topics into %s (readers: %s)", len(config.topics), config.clickhouse_url, url
        )
        if config.ready_file:
            write_ready_file(config.ready_file, url)

    stats = run_sink(config, stop, ready)
    log.info("sink stopped: %s", stats)
    return stats


def run_sink(
    config: SinkConfig, stop: threading.Event | None = None, ready: Callable[[str], None] | None = None
) -> dict:
    """Run the sink until `stop` is set. Migrates first; serves an embedded chDB path over HTTP."""
    from clients.clickhouse.client import open_and_serve
    from clients.clickhouse.migrate import migrate

    stop = stop or threading.Event()
    client, endpoint = open_and_serve(config.clickhouse_url, port=config.endpoint_port, prepare=migrate)
    try:
        ensure_topics(config.bootstrap_servers, [TOPICS[t] for t in config.topics])
        if config.from_beginning:
            rewind_group(config)
        url = endpoint.url if endpoint else config.clickhouse_url
        return _consume(config, client, stop, (lambda: ready(url)) if ready else None)
    finally:
        if endpoint is not None:
            endpoint.close()
        client.close()


def _consume(config: SinkConfig, client, stop: threading.Event, ready: Callable[[], None] | None) -> dict:
    return asyncio.run(_consume_async(config, client, stop, ready))


async def _consume_async(
    config: SinkConfig, client, stop: threading.Event, ready: Callable[[], None] | None
) -> dict:
    consumer = _consumer(config)
    producer = make_producer(config.bootstrap_servers, f"{config.group_id}-dlq")
    handler = SinkHandler(config, client, producer)
    loop = ConsumeLoop(consumer, producer, handler, _loop_config(config))
    loop.subscribe(config.topics)
    await consumer.start()
    pace_fetches(consumer, config.fetch_idle_wait_ms)
    if ready is not None:
        ready()
    try:
        await loop.run_async(stop.is_set)
    finally:
        handler.close()
        await consumer.stop()
        producer.close()
    return {**handler.stats, "dead_letters": handler.stats["dead_letters"] + loop.dead_lettered}


def _loop_config(config: SinkConfig) -> LoopConfig:
    # a short poll: a due write (by time) starts within 0.1 s; on stop everything consumed is written
    return LoopConfig(STAGE, REFUSAL, 100, config.batch_rows, write_all_on_stop=True)

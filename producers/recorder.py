"""`AgentRecorder`: the agent telemetry SDK (sync) and `AsyncAgentRecorder` (asyncio).

    rec = AgentRecorder(bootstrap_servers="127.0.0.1:19092", data_dir=".agentstream",
                        agent="my-agent", model="claude-x", policy_version="v1")
    with rec.episode(task_id="t1", task="fix the bug", domain="coding") as ep:
        ep.step(thought="look", tool="bash", params={"cmd": "ls"}, observation="a.py", exit_code=0)
        ep.end(success=True, score=1.0)
    rec.flush()   # True once the broker acknowledged everything recorded so far

Pipeline: `ep.step()` validates and encodes the event in the caller's thread and puts it in a
bounded in-memory buffer (non-blocking while there is room). A writer thread appends the buffer to
the local spool (`producers.spool`, fsynced, one fsync per batch) and a delivery thread sends the
spool to `agent.events` with kafka-python (acks=all, idempotence on, linger for batching), moving
the spool's cursor only after the broker's acknowledgement (`producers.delivery`). Every event goes
through the spool (write-ahead), so one path serves both a healthy and an unreachable broker, and
order per trajectory is the order of `step()` calls.

What "acknowledged" means (the no-loss contract):
- `ep.step()` / `ep.end()` returning = *accepted*: validated and in the buffer. It survives a broken
  network or a broker outage of any length (it is spooled and delivered when the broker is back),
  but not a crash of this process in the few milliseconds before the writer spooled it.
- `rec.flush(until="spooled")` returning True = *durable*: fsynced in the local spool; survives
  kill -9 of this process (the next recorder or `agentstream spool flush` on the same data dir
  delivers it) and broker outages.
- `rec.flush()` (until="delivered") returning True = *delivered*: acknowledged by the broker with
  acks=all. Returns False if `timeout` passed first; the events are then still safe in the spool.
- Replays never duplicate: see `producers.delivery` for the exact guarantee. Event ids are
  deterministic (`derived_event_id(type, trajectory_id[, step_index])`).

Limits: the spool grows without bound while the broker is away (it is local disk, `spool status`
shows it); a recorder's threads do not survive `fork()`, so create one recorder per process; a disk
that cannot be written makes every later `step()` and `flush()` raise `ProducerError` (the events of
the batch being written at that moment are reported lost that way, never silently).

Buffer policy when full (`on_full`): "block" waits up to `block_timeout_s` for room, then raises
`RecorderBufferFull`; "raise" raises at once. The buffer only fills when the disk cannot keep up: a
broker outage does not block the agent, it grows the spool.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from producers.delivery import DeliveryConfig, SpoolDelivery
from producers.episode import EpisodeIdentity, EpisodeLog, error_text
from producers.errors import ProducerError, RecorderBufferFull, RecorderClosed
from producers.spool import Spool, SpoolRecord
from schemas.codec import encode, encode_key
from schemas.events import EventBase
from schemas.topics import topic_for

log = logging.getLogger(__name__)

SDK_VERSION = "0.1.0"
OnFull = Literal["block", "raise"]


@dataclass(frozen=True)
class RecorderConfig:
    """Tuning of the recorder; every field can also be given to `AgentRecorder(...)` by name."""

    buffer_size: int = 10_000
    on_full: OnFull = "block"
    block_timeout_s: float = 10.0
    linger_ms: int = 5
    chunk_records: int = 2000
    fsync: bool = True
    segment_bytes: int = 64 * 1024 * 1024
    policy_ttl_s: float = 5.0
    connect_timeout_ms: int = 3000
    delivery_timeout_ms: int = 30_000
    close_timeout_s: float = 10.0
    max_event_bytes: int = 1_000_000  # Apache Kafka's default message.max.bytes
    producer: str = f"sdk/{SDK_VERSION}"

    def __post_init__(self):
        if self.on_full not in ("block", "raise"):
            raise ProducerError(f"on_full: expected 'block' or 'raise', got {self.on_full!r}")
        if self.buffer_size < 1:
            raise ProducerError(f"buffer_size: must be at least 1, got {self.buffer_size!r}")


class EventBuffer:
    """A bounded FIFO between callers and the writer thread.

    >>> buf = EventBuffer(1)
    >>> buf.put("a", "raise")
    1
    >>> try:
    ...     buf.put("b", "raise")
    ... except RecorderBufferFull as exc:
    ...     print(exc.capacity)
    1
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._items: deque = deque()
        self._cond = threading.Condition()
        self.accepted = 0
        self.closed = False

    def put(self, item: Any, on_full: OnFull = "block", timeout_s: float = 10.0) -> int:
        """Append `item`; returns its 1-based acceptance number."""
        with self._cond:
            if self.closed:
                raise RecorderClosed("the recorder is closed; create a new one to record more events")
            if len(self._items) >= self.capacity:
                if on_full == "raise":
                    raise RecorderBufferFull(self.capacity)
                start = time.monotonic()
                if not self._cond.wait_for(
                    lambda: len(self._items) < self.capacity or self.closed, timeout_s
                ):
                    raise RecorderBufferFull(self.capacity, time.monotonic() - start)
                if self.closed:
                    raise RecorderClosed("the recorder was closed while waiting for buffer room")
            self._items.append(item)
            self.accepted += 1
            self._cond.notify_all()
            return self.accepted

    def take(self, max_items: int, wait_s: float) -> list:
        """Up to `max_items` items, waiting up to `wait_s` for the first one."""
        with self._cond:
            if not self._items:
                self._cond.wait_for(lambda: self._items or self.closed, wait_s)
            out = [self._items.popleft() for _ in range(min(max_items, len(self._items)))]
            if out:
                self._cond.notify_all()
            return out

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        return len(self._items)


class AgentRecorder:
    """Records agent episodes to `agent.events` through a local spool (see the module docstring).

    `bootstrap_servers` and `data_dir` default to `schemas.settings.Settings()` (environment
    `AGENTSTREAM_BOOTSTRAP_SERVERS`, `AGENTSTREAM_DATA_DIR`). `follow_policy=True` stamps each new
    episode with the newest `policy_version` published on `policy.updates` (cached `policy_ttl_s`).
    `on_delivered(records)` is called from the delivery thread after each acknowledged chunk.
    """

    def __init__(
        self,
        bootstrap_servers: str | None = None,
        data_dir: str | Path | None = None,
        *,
        agent: str = "",
        model: str = "",
        policy_version: str | None = None,
        follow_policy: bool = False,
        config: RecorderConfig | None = None,
        on_delivered: Callable[[list[SpoolRecord]], None] | None = None,
        **options: Any,
    ):
        known = {f.name for f in fields(RecorderConfig)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ProducerError(f"unknown AgentRecorder option(s) {unknown}; known: {sorted(known)}")
        self.config = replace(config or RecorderConfig(), **options)
        if bootstrap_servers is None or data_dir is None:
            from schemas.settings import Settings

            settings = Settings()
            bootstrap_servers = bootstrap_servers or settings.bootstrap_servers
            data_dir = data_dir if data_dir is not None else settings.data_dir
        self.bootstrap_servers = bootstrap_servers
        self.data_dir = Path(data_dir)
        self.agent, self.model, self.policy_version = agent, model, policy_version
        self._policy = PolicyFollower(bootstrap_servers, self.config.policy_ttl_s) if follow_policy else None
        self._user_on_delivered = on_delivered
        self._start_threads()
        atexit.register(self.close)

    def _start_threads(self) -> None:
        cfg = self.config
        self.spool = Spool.open_slot(
            self.data_dir / "spool", segment_bytes=cfg.segment_bytes, fsync=cfg.fsync
        )
        self._base_seq = self.spool.end_seq  # acceptance number n is spool sequence base + n - 1
        self._buffer = EventBuffer(cfg.buffer_size)
        self._progress = threading.Condition()
        self._spooled_seq = self.spool.end_seq
        self._writer_error: BaseException | None = None
        self._wake = threading.Event()
        self._stop_delivery = threading.Event()
        self._closed = False
        self.broker_failing = False  # the last delivery attempt failed (the broker is unreachable?)
        delivery_config = DeliveryConfig(
            bootstrap_servers=self.bootstrap_servers,
            client_id=f"agentstream-{self.agent or 'sdk'}",
            linger_ms=cfg.linger_ms,
            chunk_records=cfg.chunk_records,
            connect_timeout_ms=cfg.connect_timeout_ms,
            delivery_timeout_ms=cfg.delivery_timeout_ms,
        )
        self._delivery = SpoolDelivery(self.spool, delivery_config, on_delivered=self._on_delivered)
        self._writer = threading.Thread(target=self._write_loop, name="agentstream-spool-writer", daemon=True)
        self._sender = threading.Thread(target=self._deliver_loop, name="agentstream-delivery", daemon=True)
        self._writer.start()
        self._sender.start()
        if self.spool.pending:
            log.info(
                "spool %s: %d undelivered events from an earlier run",
                self.spool.directory,
                self.spool.pending,
            )

    # --- recording --------------------------------------------------------------------------------

    def episode(
        self,
        task_id: str,
        task: str = "",
        domain: str = "generic",
        group_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        trajectory_id: str | None = None,
        policy_version: str | None = None,
        reference_steps: int | None = None,
    ) -> Episode:
        """Start an episode (publishes `episode.started`); use as a context manager.
        `reference_steps`: the step count a good solution needs (the efficiency reward uses it)."""
        log_ = EpisodeLog(
            self._identity(
                task_id, task, domain, group_id, metadata, trajectory_id, policy_version, reference_steps
            ),
            self.config.producer,
        )
        episode = Episode(self, log_)
        self.publish(log_.started())
        return episode

    def _identity(
        self, task_id, task, domain, group_id, metadata, trajectory_id, policy_version, reference_steps=None
    ) -> EpisodeIdentity:
        if policy_version is None:
            policy_version = self.current_policy_version()
        return EpisodeIdentity(
            trajectory_id=trajectory_id or str(uuid.uuid4()),
            task_id=task_id,
            task=task,
            domain=domain,
            agent=self.agent,
            model=self.model,
            policy_version=policy_version,
            group_id=group_id,
            metadata=dict(metadata or {}),
            reference_steps=reference_steps,
        )

    def current_policy_version(self) -> str | None:
        """The policy version new episodes get: the latest on `policy.updates` when following."""
        if self._policy is None:
            return self.policy_version
        latest = self._policy.latest()
        return latest if latest is not None else self.policy_version

    def publish(self, event: EventBase, on_full: OnFull | None = None) -> int:
        """Accept one event for delivery (any registry event type; routed by its type)."""
        if self._writer_error is not None:
            raise ProducerError(
                f"the spool writer failed; nothing more can be recorded: {self._writer_error!r}"
            )
        value = encode(event)
        if len(value) > self.config.max_event_bytes:
            raise ProducerError(
                f"{event.type} {event.event_id}: encoded event of {len(value)} bytes exceeds max_event_bytes="
                f"{self.config.max_event_bytes} (brokers refuse larger records); shorten observation/params"
            )
        record = SpoolRecord(topic_for(event.type), encode_key(event), event.event_id, value)
        return self._buffer.put(record, on_full or self.config.on_full, self.config.block_timeout_s)

    # --- threads ----------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            batch = self._buffer.take(max_items=self.config.chunk_records, wait_s=0.1)
            if not batch:
                if self._buffer.closed and not len(self._buffer):
                    return
                continue
            try:
                end = self.spool.append(batch)
            except BaseException as exc:  # a full or failing disk: surface to callers, never drop silently
                log.exception("spool %s: cannot write %d events", self.spool.directory, len(batch))
                self._writer_error = exc
                with self._progress:
                    self._progress.notify_all()
                return
            with self._progress:
                self._spooled_seq = end
                self._progress.notify_all()
            self._wake.set()

    def _deliver_loop(self) -> None:
        backoff = self._delivery.config.retry_backoff_s
        while not self._stop_delivery.is_set():
            if self.spool.pending == 0:
                self._wake.wait(0.1)
                self._wake.clear()
                continue
            try:
                self._delivery.deliver_once()
                backoff = self._delivery.config.retry_backoff_s
                self.broker_failing = False
            except Exception as exc:
                with self._progress:
                    self.broker_failing = True
                    self._progress.notify_all()
                backoff = self._delivery.backoff_after_failure(exc, backoff, 1e9, self._stop_delivery)

    def _on_delivered(self, records: list[SpoolRecord]) -> None:
        with self._progress:
            self._progress.notify_all()
        if self._user_on_delivered is not None:
            try:
                self._user_on_delivered(records)
            except Exception:
                log.exception("on_delivered callback failed")

    # --- flushing and closing ---------------------------------------------------------------------

    def flush(
        self,
        timeout: float | None = None,
        until: Literal["delivered", "spooled"] = "delivered",
        *,
        _stop_if_failing: bool = False,
    ) -> bool:
        """Wait until every event accepted before this call is spooled (fsynced) or delivered
        (acknowledged by the broker). Returns False if `timeout` seconds passed first."""
        if until not in ("delivered", "spooled"):
            raise ProducerError(f"until: expected 'delivered' or 'spooled', got {until!r}")
        target = self._base_seq + self._buffer.accepted

        def done() -> bool:
            if self._writer_error is not None:
                raise ProducerError(f"the spool writer failed: {self._writer_error!r}")
            reached = self._spooled_seq if until == "spooled" else self.spool.cursor.delivered
            return reached >= target or (_stop_if_failing and self.broker_failing)

        self._wake.set()
        with self._progress:
            self._progress.wait_for(done, timeout)
        reached = self._spooled_seq if until == "spooled" else self.spool.cursor.delivered
        return reached >= target

    @property
    def pending(self) -> int:
        """Events accepted but not yet acknowledged by the broker (buffered + spooled)."""
        return len(self._buffer) + self.spool.pending

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting events, spool everything buffered, try to deliver for up to `timeout`
        seconds (default `close_timeout_s`), then stop. Returns True if nothing is left undelivered;
        anything left stays in the spool and is delivered by the next recorder on this data dir."""
        if self._closed:
            return self.spool.pending == 0
        self._closed = True
        atexit.unregister(self.close)
        timeout = self.config.close_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self._buffer.close()
        self._writer.join()  # local disk only: bounded by the buffer size
        # With the broker failing, do not hold the process up: everything is durable in the spool.
        delivered = self.flush(max(0.0, deadline - time.monotonic()), _stop_if_failing=True)
        self._stop_delivery.set()
        self._sender.join(timeout=max(1.0, deadline - time.monotonic()))
        if self._sender.is_alive():
            # Keep the spool locked until this process exits so no other process replays it meanwhile.
            log.warning(
                "spool %s: delivery thread still busy at close; %d events stay spooled",
                self.spool.directory,
                self.spool.pending,
            )
            return False
        self._delivery.close()
        left = self.spool.pending
        self.spool.close()
        if left:
            log.warning(
                "closed with %d events undelivered; they stay in the spool under %s", left, self.data_dir
            )
        return delivered and left == 0

    def __enter__(self) -> AgentRecorder:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _publish_or_retract(publish: Callable[[EventBase], int], log_: EpisodeLog, event: EventBase) -> None:
    """Publish `event`; if it was not accepted (buffer full, closed), the episode state goes back so
    the caller may retry the same call."""
    try:
        publish(event)
    except BaseException:
        log_.retract(event)
        raise


class Episode:
    """One episode being recorded. Use as a context manager: an exception inside the block ends
    the episode as failed (`success=False`, `error="ExcType: message"`) and propagates; leaving the
    block without `end()` records `success=False, terminated=False, truncated=True`."""

    def __init__(self, recorder: AgentRecorder, log_: EpisodeLog):
        self._recorder = recorder
        self._log = log_

    @property
    def trajectory_id(self) -> str:
        return self._log.trajectory_id

    @property
    def ended(self) -> bool:
        return self._log.ended_event is not None

    def step(
        self,
        thought: Any = "",
        tool: str = "",
        params: dict[str, Any] | None = None,
        observation: Any = "",
        exit_code: int | None = None,
        error: str | None = None,
        **extra: Any,
    ):
        """Record the next step (index and timestamp automatic). `extra`: `input_tokens`,
        `output_tokens`, `latency_ms`, `token_ids`, `logprobs`, `model`, `policy_version`."""
        event = self._log.step(
            thought=thought,
            tool=tool,
            params=params,
            observation=observation,
            exit_code=exit_code,
            error=error,
            **extra,
        )
        _publish_or_retract(self._recorder.publish, self._log, event)
        return event

    def end(self, success: bool, score: float | None = None, **extra: Any):
        """End the episode. `extra`: `tests_passed`, `tests_failed`, `terminated`, `truncated`, `error`."""
        event = self._log.ended(success=success, score=score, **extra)
        _publish_or_retract(self._recorder.publish, self._log, event)
        return event

    def __enter__(self) -> Episode:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.ended:
            return False
        if exc is not None:
            self.end(success=False, error=error_text(exc))
        else:
            log.warning(
                "trajectory %s: episode left without end(); recorded as truncated", self.trajectory_id
            )
            self.end(success=False, terminated=False, truncated=True)
        return False


# --- policy following ------------------------------------------------------------------------------


class PolicyFollower:
    """The newest `policy_version` on `policy.updates` (a 1-partition topic: its last record),
    cached for `ttl_s`. The first lookup waits for the broker (up to `timeout_ms`); later ones
    answer from the cache at once and refresh it in a background thread when it is stale, so an
    unreachable broker never holds up `rec.episode()`. A failed refresh keeps the previous answer."""

    def __init__(self, bootstrap_servers: str, ttl_s: float = 5.0, timeout_ms: int = 2000):
        self.bootstrap_servers = bootstrap_servers
        self.ttl_s = ttl_s
        self.timeout_ms = timeout_ms
        self._value: str | None = None
        self._checked_at: float | None = None
        self._refreshing = False
        self._lock = threading.Lock()

    def latest(self) -> str | None:
        with self._lock:
            first = self._checked_at is None
            stale = first or time.monotonic() - self._checked_at >= self.ttl_s
            start_refresh = stale and not self._refreshing
            if start_refresh:
                self._refreshing = True
        if first and start_refresh:
            self._refresh()
        elif start_refresh:
            threading.Thread(target=self._refresh, name="agentstream-policy", daemon=True).start()
        return self._value

    def _refresh(self) -> None:
        try:
            value = self._read_last()
        except Exception as exc:
            log.warning("cannot read policy.updates from %s: %s", self.bootstrap_servers, exc)
            value = None
        with self._lock:
            self._value = value or self._value
            self._checked_at = time.monotonic()
            self._refreshing = False

    def _read_last(self) -> str | None:
        from kafka import KafkaConsumer, TopicPartition

        from schemas.codec import decode
        from schemas.topics import POLICY_UPDATES

        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            bootstrap_timeout_ms=self.timeout_ms,
            request_timeout_ms=self.timeout_ms + 1000,
        )
        try:
            tp = TopicPartition(POLICY_UPDATES, 0)
            if not consumer.partitions_for_topic(POLICY_UPDATES):
                return None
            end = consumer.end_offsets([tp])[tp]
            if end == 0:
                return None
            consumer.assign([tp])
            consumer.seek(tp, end - 1)
            deadline = time.monotonic() + self.timeout_ms / 1000
            while time.monotonic() < deadline:
                records = consumer.poll(timeout_ms=200).get(tp, [])
                if records:
                    return getattr(decode(records[-1].value), "policy_version", None)
            return None
        finally:
            consumer.close()


# --- asyncio ---------------------------------------------------------------------------------------


class AsyncAgentRecorder:
    """The asyncio variant: same pipeline and guarantees; `await ep.step(...)` never blocks the
    event loop (a full buffer under on_full="block" is waited for in an executor thread).

        async with AsyncAgentRecorder(bootstrap_servers=..., data_dir=..., agent="a") as rec:
            async with rec.episode(task_id="t1") as ep:
                await ep.step(tool="search", observation="...")
                await ep.end(success=True)
    """

    def __init__(self, *args: Any, **kwargs: Any):
        self.sync = AgentRecorder(*args, **kwargs)

    def episode(self, task_id: str, **kwargs: Any) -> AsyncEpisode:
        """An episode to use with `async with` (its `episode.started` is published on entry)."""
        return AsyncEpisode(self, task_id, kwargs)

    async def publish(self, event: EventBase) -> int:
        try:
            return self.sync.publish(event, on_full="raise")
        except RecorderBufferFull:
            if self.sync.config.on_full == "raise":
                raise
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.sync.publish, event)

    async def flush(
        self, timeout: float | None = None, until: Literal["delivered", "spooled"] = "delivered"
    ) -> bool:
        return await asyncio.get_running_loop().run_in_executor(None, self.sync.flush, timeout, until)

    async def close(self, timeout: float | None = None) -> bool:
        return await asyncio.get_running_loop().run_in_executor(None, self.sync.close, timeout)

    async def __aenter__(self) -> AsyncAgentRecorder:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()


class AsyncEpisode:
    """`async with rec.episode(...) as ep`: same semantics as `Episode`, awaitable."""

    def __init__(self, recorder: AsyncAgentRecorder, task_id: str, options: dict[str, Any]):
        self._recorder = recorder
        self._task_id = task_id
        self._options = options
        self._log: EpisodeLog | None = None

    @property
    def trajectory_id(self) -> str:
        return self._started().trajectory_id

    def _started(self) -> EpisodeLog:
        if self._log is None:
            raise ProducerError("use the episode inside `async with rec.episode(...) as ep`")
        return self._log

    async def __aenter__(self) -> AsyncEpisode:
        sync = self._recorder.sync
        o = self._options
        identity = await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: sync._identity(
                self._task_id, o.get("task", ""), o.get("domain", "generic"), o.get("group_id"),
                o.get("metadata"), o.get("trajectory_id"), o.get("policy_version"),
                o.get("reference_steps"),
            ),
        )  # fmt: skip
        self._log = EpisodeLog(identity, sync.config.producer)
        await self._recorder.publish(self._log.started())
        return self

    async def step(
        self,
        thought: Any = "",
        tool: str = "",
        params: dict | None = None,
        observation: Any = "",
        **extra: Any,
    ):
        event = self._started().step(
            thought=thought, tool=tool, params=params, observation=observation, **extra
        )
        await self._publish(event)
        return event

    async def end(self, success: bool, score: float | None = None, **extra: Any):
        event = self._started().ended(success=success, score=score, **extra)
        await self._publish(event)
        return event

    async def _publish(self, event: EventBase) -> None:
        try:
            await self._recorder.publish(event)
        except BaseException:
            self._started().retract(event)
            raise

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        if self._log is None or self._log.ended_event is not None:
            return False
        if exc is not None:
            await self.end(success=False, error=error_text(exc))
        else:
            await self.end(success=False, terminated=False, truncated=True)
        return False

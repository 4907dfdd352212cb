"""`AgentRecorder`: the agent telemetry SDK (sync) and `AsyncAgentRecorder` (asyncio).

    rec = AgentRecorder(bootstrap_servers="127.0.0.1:19092", data_dir=".agentstream",
                        agent="my-agent", model="claude-x", policy_version="v1")
    with rec.episode(task_id="t1", task="fix the bug", domain="coding") as ep:
        ep.step(thought="look", tool="bash", params={"cmd": "ls"}, observation="a.py", exit_code=0)
        ep.end(success=True, score=1.0)
    rec.flush()   # True once the broker acknowledged everything recorded so far

Pipeline: `ep.step()` validates and encodes the event in the caller's thread and puts it in a
bounded in-memory buffer (non-blocking while there is room). A writer thread appends the buffer to
the local spool (`producers.sdk.spool`, fsynced, one fsync per batch) and a delivery thread sends the
spool to `agent.events` as record batches through aiokafka (acks=all, idempotence on), moving
the spool's cursor only after the broker's acknowledgement (`producers.sdk.delivery`). Every event goes
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
- Replays never duplicate: see `producers.sdk.delivery` for the exact guarantee. Event ids are
  deterministic (`derived_event_id(type, trajectory_id[, step_index])`).

Limits: the spool grows without bound while the broker is away (it is local disk, `spool status`
shows it); a recorder's threads do not survive `fork()`, so create one recorder per process; a disk
that cannot be written makes every later `step()` and `flush()` raise `ProducerError` (the events of
the batch being written at that moment are reported lost that way, never silently).

Here lives the public API (`AgentRecorder`, `Episode` and their asyncio variants); the buffer and
the two threads are `producers.sdk.pipeline`, policy following is `producers.sdk.policy_follower`.

Redaction: `publish` passes every event through the process's redactor (`producers.redaction`,
configured by the settings file: `settings_file`, else `$AGENTSTREAM_SETTINGS_FILE`, else
`<data_dir>/settings.yaml`) before it is encoded, so secrets never reach the spool or the broker.

Buffer policy when full (`on_full`): "block" waits up to `block_timeout_s` for room, then raises
`RecorderBufferFull`; "raise" raises at once. The buffer only fills when the disk cannot keep up: a
broker outage does not block the agent, it grows the spool.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import uuid
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from producers.errors import ProducerError, RecorderBufferFull
from producers.redaction_settings import load_redactor
from producers.sdk.delivery import DeliveryConfig
from producers.sdk.episode import EpisodeIdentity, EpisodeLog, error_text
from producers.sdk.pipeline import (
    OnFull,
    RecorderConfig,
    RecordingPipeline,
    Until,
)
from producers.sdk.policy_follower import PolicyFollower
from producers.sdk.spool import Spool, SpoolRecord
from schemas.codec import encode, encode_key
from schemas.events import EventBase
from schemas.topics import topic_for

__all__ = ["AgentRecorder", "AsyncAgentRecorder", "AsyncEpisode", "Episode"]

log = logging.getLogger(__name__)


class AgentRecorder:
    """Records agent episodes to `agent.events` through a local spool (see the module docstring).

    `bootstrap_servers` and `data_dir` default to `schemas.settings.Settings()` (environment
    `AGENTSTREAM_BOOTSTRAP_SERVERS`, `AGENTSTREAM_DATA_DIR`). `follow_policy=True` stamps each new
    episode with the newest `policy_version` published on `policy.updates` (cached `policy_ttl_s`).
    `on_delivered(records)` is called from the delivery thread after each acknowledged chunk.
    `purpose="eval"` marks every episode as an evaluation (`episode.started.purpose`): batch builders
    never train on it.
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
        purpose: str = "train",
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
        if purpose not in ("train", "eval"):
            raise ProducerError(f"purpose={purpose!r}: expected 'train' or 'eval'")
        self.purpose = purpose  # stamped on every episode.started (schema 1.5)
        self.redactor = load_redactor(self.config.settings_file, self.data_dir)
        self._policy = PolicyFollower(bootstrap_servers, self.config.policy_ttl_s) if follow_policy else None
        cfg = self.config
        delivery_config = DeliveryConfig(
            bootstrap_servers=self.bootstrap_servers,
            client_id=f"agentstream-{self.agent or 'sdk'}",
            linger_ms=cfg.linger_ms,
            chunk_records=cfg.chunk_records,
            connect_timeout_ms=cfg.connect_timeout_ms,
            delivery_timeout_ms=cfg.delivery_timeout_ms,
        )
        self._pipeline = RecordingPipeline(self.data_dir / "spool", cfg, delivery_config, on_delivered)
        self._closed = False
        atexit.register(self.close)

    @property
    def spool(self) -> Spool:
        """This recorder's spool slot."""
        return self._pipeline.spool

    @property
    def broker_failing(self) -> bool:
        """Whether the last delivery attempt failed (the broker is unreachable?)."""
        return self._pipeline.broker_failing

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
            purpose=self.purpose,
        )

    def current_policy_version(self) -> str | None:
        """The policy version new episodes get: the latest on `policy.updates` when following."""
        if self._policy is None:
            return self.policy_version
        latest = self._policy.latest()
        return latest if latest is not None else self.policy_version

    def publish(self, event: EventBase, on_full: OnFull | None = None) -> int:
        """Accept one event for delivery (any registry event type; routed by its type), redacted."""
        if self._pipeline.writer_error is not None:
            raise ProducerError(
                f"the spool writer failed; nothing more can be recorded: {self._pipeline.writer_error!r}"
            )
        event = self.redactor.redact_event(event)
        value = encode(event)
        if len(value) > self.config.max_event_bytes:
            raise ProducerError(
                f"{event.type} {event.event_id}: encoded event of {len(value)} bytes exceeds max_event_bytes="
                f"{self.config.max_event_bytes} (brokers refuse larger records); shorten observation/params"
            )
        record = SpoolRecord(topic_for(event.type), encode_key(event), event.event_id, value)
        return self._pipeline.put(record, on_full)

    # --- flushing and closing ---------------------------------------------------------------------

    def flush(self, timeout: float | None = None, until: Until = "delivered") -> bool:
        """Wait until every event accepted before this call is spooled (fsynced) or delivered
        (acknowledged by the broker). Returns False if `timeout` seconds passed first."""
        if until not in ("delivered", "spooled"):
            raise ProducerError(f"until: expected 'delivered' or 'spooled', got {until!r}")
        return self._pipeline.flush(timeout, until)

    @property
    def pending(self) -> int:
        """Events accepted but not yet acknowledged by the broker (buffered + spooled)."""
        return self._pipeline.pending

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting events, spool everything buffered, try to deliver for up to `timeout`
        seconds (default `close_timeout_s`), then stop. Returns True if nothing is left undelivered;
        anything left stays in the spool and is delivered by the next recorder on this data dir."""
        if self._closed:
            return self.spool.pending == 0
        self._closed = True
        atexit.unregister(self.close)
        return self._pipeline.close(self.config.close_timeout_s if timeout is None else timeout)

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

    async def flush(self, timeout: float | None = None, until: Until = "delivered") -> bool:
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

"""The pure core of recording one episode: builds `episode.started`, `step.recorded` and
`episode.ended` events with automatic step indexes, UTC timestamps and deterministic ids.

No I/O here: `producers.sdk.recorder` publishes what this module builds.

Event ids are derived from the trajectory id (and the step index), so recording the same trajectory
id twice - a retried rollout, a replayed log - produces the same ids and downstream dedup holds.

>>> log = EpisodeLog(EpisodeIdentity("traj-1", "task-1", agent="a", model="m"), producer="sdk/test")
>>> log.started().type, log.step(tool="bash").step_index, log.step().step_index
('episode.started', 0, 1)
>>> log.ended(success=True).total_steps
2
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from producers.errors import EpisodeStateError, ProducerError
from schemas.codec import field_errors
from schemas.events import EpisodeEnded, EpisodeStarted, EventBase, StepRecorded, utc_now
from schemas.ids import derived_event_id


@dataclass(frozen=True)
class EpisodeIdentity:
    """What is fixed for a whole episode."""

    trajectory_id: str
    task_id: str
    task: str = ""
    domain: str = "generic"
    agent: str = ""
    model: str = ""
    policy_version: str | None = None
    group_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    reference_steps: int | None = None
    purpose: str = "train"  # "eval": batch builders never train on the episode (schema 1.5)


def build_event(event_model: type[EventBase], **fields: Any) -> EventBase:
    """Validate and build one event; a bad field raises `ProducerError` naming field and value."""
    try:
        return event_model(**fields)
    except ValidationError as exc:
        problems = "; ".join(str(e) for e in field_errors(exc))
        raise ProducerError(f"{event_model.model_fields['type'].default}: {problems}") from None


def as_text(value: Any) -> str:
    """Observations and thoughts are text; anything else is stored as compact JSON.

    >>> as_text({"a": 1}), as_text(None), as_text("x")
    ('{"a":1}', '', 'x')
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return orjson.dumps(value, default=str, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def error_text(exc: BaseException) -> str:
    """How a failed episode records its exception: `ExcType: message`.

    >>> error_text(ValueError("boom"))
    'ValueError: boom'
    """
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


class EpisodeLog:
    """Builds the events of one episode in order; refuses steps after the end."""

    def __init__(self, identity: EpisodeIdentity, producer: str):
        self.identity = identity
        self.producer = producer
        self.steps = 0
        self.ended_event: EpisodeEnded | None = None
        self._lock = threading.Lock()

    @property
    def trajectory_id(self) -> str:
        return self.identity.trajectory_id

    def _envelope(self, event_type: str, *parts: object) -> dict[str, Any]:
        return {
            "event_id": derived_event_id(event_type, self.trajectory_id, *parts),
            "trajectory_id": self.trajectory_id,
            "occurred_at": utc_now(),
            "producer": self.producer,
        }

    def started(self) -> EpisodeStarted:
        i = self.identity
        return build_event(
            EpisodeStarted,
            **self._envelope("episode.started"),
            task_id=i.task_id,
            task=i.task,
            domain=i.domain,
            agent=i.agent,
            model=i.model,
            policy_version=i.policy_version,
            group_id=i.group_id,
            metadata=i.metadata,
            reference_steps=i.reference_steps,
            purpose=i.purpose,
        )

    def step(self, **fields: Any) -> StepRecorded:
        """The next step; `thought`/`observation` that are not text are stored as JSON."""
        for name in ("thought", "observation"):
            if name in fields:
                fields[name] = as_text(fields[name])
        if fields.get("params") is None:
            fields.pop("params", None)
        fields.setdefault("model", self.identity.model)
        fields.setdefault("policy_version", self.identity.policy_version)
        with self._lock:
            if self.ended_event is not None:
                raise EpisodeStateError(f"trajectory {self.trajectory_id}: step() after the episode ended")
            event = build_event(
                StepRecorded, **self._envelope("step.recorded", self.steps), step_index=self.steps, **fields
            )
            self.steps += 1
        return event

    def retract(self, event: EventBase) -> None:
        """Undo the state change of the latest `step()` or `ended()` (its event was not accepted).

        >>> log = EpisodeLog(EpisodeIdentity("t", "task"), producer="p")
        >>> log.retract(log.step()); log.step().step_index
        0
        """
        with self._lock:
            if event is self.ended_event:
                self.ended_event = None
            elif isinstance(event, StepRecorded) and event.step_index == self.steps - 1:
                self.steps -= 1

    def ended(self, **fields: Any) -> EpisodeEnded:
        with self._lock:
            if self.ended_event is not None:
                raise EpisodeStateError(f"trajectory {self.trajectory_id}: end() called twice")
            fields.setdefault("total_steps", self.steps)
            self.ended_event = build_event(EpisodeEnded, **self._envelope("episode.ended"), **fields)
        return self.ended_event

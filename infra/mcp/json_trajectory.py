"""The rule layer on a trajectory given as JSON: the same pure code the stream workers run.

A trajectory object (`score_trajectory` and `build_preferences` take it) holds the event contract's
fields (schemas/events/) flattened into one object:

    {"trajectory_id": "t1", "task_id": "fix-1", "domain": "coding", "reference_steps": 3,
     "steps": [{"tool": "read_file", "params": {"file_path": "a.py"}, "observation": "..."}, ...],
     "outcome": {"success": true, "tests_passed": 3, "tests_failed": 1}}

Envelope fields are filled in (ids derived from the content, so the same JSON gives the same ids),
the steps become `step.recorded` events (a step without `step_index` takes its position), the rule
state machine (streams/rules/stream.py) scores them and the assembler's `score_trajectory`
(streams/assembler/assembly.py) joins everything into the `trajectory.scored` the pipeline would
emit without judge or human layers. No I/O.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from pydantic import ValidationError

from infra.mcp.errors import McpToolError
from schemas.codec import field_errors
from schemas.events import EpisodeEnded, EpisodeStarted, StepRecorded, TrajectoryScored
from schemas.ids import derived_event_id
from schemas.json_input import json_object
from streams.assembler.assembly import STARTED_FIELDS, Assembly
from streams.assembler.reward_math import Calibrations
from streams.assembler.scored import score_trajectory
from streams.rules.profiles import ProfileRegistry
from streams.rules.stream import TrajectoryRules

PRODUCER = "agentstream-mcp"
ENDED_KEYS = ("success", "score", "tests_passed", "tests_failed", "error")
# Events of a JSON trajectory carry this time unless it gives `started_at`: the scores never use it.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def as_object(value: Any, where: str) -> dict[str, Any]:
    """A JSON object given as a dict or as JSON text."""
    if isinstance(value, str | bytes):
        return json_object(value, where, McpToolError)
    if not isinstance(value, dict):
        raise McpToolError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _validated(event_class, where: str, fields: dict[str, Any]):
    try:
        return event_class(**fields)
    except ValidationError as exc:
        raise McpToolError("; ".join(f"{where}.{e}" for e in field_errors(exc, fields))) from None


def _trajectory_id(data: dict[str, Any]) -> str:
    if data.get("trajectory_id"):
        return str(data["trajectory_id"])
    digest = hashlib.blake2b(orjson.dumps(data, option=orjson.OPT_SORT_KEYS), digest_size=8).hexdigest()
    return f"mcp-{digest}"


def _started_at(data: dict[str, Any], where: str) -> datetime:
    raw = data.get("started_at")
    if not raw:
        return EPOCH
    try:
        at = datetime.fromisoformat(str(raw))
    except ValueError:
        raise McpToolError(f"{where}.started_at: expected an ISO time, got {raw!r}") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def trajectory_events(data: dict[str, Any], where: str = "trajectory") -> list:
    """The `episode.started`, `step.recorded` and (with an outcome) `episode.ended` events."""
    tid, t0 = _trajectory_id(data), _started_at(data, where)
    steps = data.get("steps")
    if not isinstance(steps, list):
        raise McpToolError(f"{where}.steps: expected a list of steps, got {type(steps).__name__}")

    def envelope(kind: str, *key: object, at: datetime) -> dict[str, Any]:
        event_id = derived_event_id(kind, tid, *key)
        return {"event_id": event_id, "trajectory_id": tid, "occurred_at": at, "producer": PRODUCER}

    started = {k: data[k] for k in STARTED_FIELDS if data.get(k) is not None}
    started.setdefault("task_id", data.get("task_id") or "task")
    events: list = [_validated(EpisodeStarted, where, started | envelope("start", at=t0))]
    for i, step in enumerate(steps):
        step = as_object(step, f"{where}.steps[{i}]")
        fields = {"step_index": i, **step}
        at = t0 + timedelta(milliseconds=i + 1)
        events.append(_validated(StepRecorded, f"{where}.steps[{i}]", fields | envelope("step", i, at=at)))
    outcome = _outcome(data, where)
    if outcome is not None:
        at = t0 + timedelta(milliseconds=len(steps) + 1)
        events.append(
            _validated(
                EpisodeEnded,
                f"{where}.outcome",
                outcome | {"total_steps": len(steps)} | envelope("end", at=at),
            )
        )
    return events


def _outcome(data: dict[str, Any], where: str) -> dict[str, Any] | None:
    outcome = data.get("outcome")
    if outcome is None:
        outcome = {k: data[k] for k in ENDED_KEYS if k in data}
    outcome = as_object(outcome, f"{where}.outcome") if outcome else None
    if outcome is not None and "success" not in outcome:
        raise McpToolError(f"{where}.outcome.success: required when an outcome is given, got {outcome!r}")
    return outcome


def rule_layer(
    data: dict[str, Any], profiles: ProfileRegistry, where: str = "trajectory"
) -> tuple[list, list]:
    """The trajectory's events and the `reward.rule.step` events the rule workers would emit."""
    events = trajectory_events(as_object(data, where), where)
    rules = TrajectoryRules()
    rules.on_started(events[0])
    for event in events:
        if isinstance(event, StepRecorded):
            rules.on_step(event)
    if rules.conflicts:
        event, reason = rules.conflicts[0]
        raise McpToolError(f"{where}.steps: {reason} (step_index {event.step_index} given twice)")
    return events, rules.advance(events[0].trajectory_id, profiles)


def score_json_trajectory(
    data: dict[str, Any], profiles: ProfileRegistry | None = None, where: str = "trajectory"
) -> TrajectoryScored:
    """The `trajectory.scored` of a JSON trajectory (rule layer, outcome and efficiency).

    >>> scored = score_json_trajectory({"domain": "coding", "steps": [
    ...     {"tool": "read_file", "params": {"file_path": "a.py"}},
    ...     {"tool": "read_file", "params": {"file_path": "a.py"}}], "outcome": {"success": True}})
    >>> [s.redundancy for s in scored.steps], scored.outcome_score, scored.complete
    ([1.0, 0.0], 1.0, True)
    """
    profiles = profiles or ProfileRegistry()
    events, rewards = rule_layer(data, profiles, where)
    tid = events[0].trajectory_id
    assembly = Assembly()
    for event in [*events, *rewards]:
        assembly.add(event, now=0.0)
    scored = score_trajectory(assembly.joined(), tid, profiles, Calibrations())
    event_id = derived_event_id("trajectory.scored", tid, 0, PRODUCER)
    return scored.model_copy(update={"event_id": event_id, "revision": 0})

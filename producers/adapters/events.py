"""The pure conversion from a parsed log episode (`EpisodeDraft`) to contract events:
`episode.started` + one `step.recorded` per agent action + `episode.ended`, with ids that depend
only on the format, the file's bytes and the episode's place in the file, so ingesting the same file
twice yields the same event ids. `Overrides` are the values given on the command line that replace
the log's.

Timestamps: a step carries the log's own timestamp when the log has one. When it does not, the
timestamp is derived deterministically from the file's modification time plus the step index (in
milliseconds), and `metadata.timestamps` says which ("log", "derived_from_mtime" or "partial").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson

from producers.adapters.contract import Document, EpisodeDraft, StepDraft
from producers.adapters.fields import non_negative
from schemas.events import EpisodeEnded, EpisodeStarted, EventBase, StepRecorded
from schemas.ids import derived_event_id


@dataclass(frozen=True)
class Overrides:
    """Values given on the command line that replace what the log says (empty = keep the log's)."""

    domain: str = ""
    agent: str = ""
    model: str = ""


def trajectory_id_for(format_name: str, doc: Document, key: str) -> str:
    """The trajectory id of episode `key` of `doc`: stable across re-ingestion of the same bytes."""
    return derived_event_id("ingest.trajectory", format_name, doc.sha256, key)


def build_events(
    draft: EpisodeDraft, doc: Document, format_name: str, overrides: Overrides = Overrides()
) -> list[EventBase]:
    """episode.started + step.recorded per step + episode.ended for one draft (pure)."""
    trajectory_id = trajectory_id_for(format_name, doc, draft.key)
    stamps, timestamp_origin = _step_times(draft, doc.mtime)
    producer = f"ingest/{format_name}"
    envelope = {"trajectory_id": trajectory_id, "producer": producer}
    model = overrides.model or draft.model
    metadata = {
        **draft.metadata,
        "source_path": str(doc.path),
        "source_format": format_name,
        "source_sha256": doc.sha256,
        "source_episode": draft.key,
        "timestamps": timestamp_origin,
        "outcome_source": draft.outcome_source,
    }
    started = EpisodeStarted(
        event_id=derived_event_id("episode.started", trajectory_id),
        occurred_at=stamps[0],
        task_id=draft.task_id,
        task=draft.task,
        domain=overrides.domain or draft.domain,
        agent=overrides.agent or draft.agent,
        model=model,
        metadata=metadata,
        **envelope,
    )
    steps = [
        _step_event(index, step, stamps[index + 1], model, envelope) for index, step in enumerate(draft.steps)
    ]
    ended = EpisodeEnded(
        event_id=derived_event_id("episode.ended", trajectory_id),
        occurred_at=stamps[-1],
        success=draft.success,
        score=draft.score,
        tests_passed=draft.tests_passed,
        tests_failed=draft.tests_failed,
        terminated=draft.terminated,
        truncated=draft.truncated,
        total_steps=len(draft.steps),
        error=draft.error,
        input_tokens=draft.input_tokens,
        output_tokens=draft.output_tokens,
        cost_usd=draft.cost_usd,
        outcome_source=draft.outcome_source,
        **envelope,
    )
    return [started, *steps, ended]


def _step_event(index: int, step: StepDraft, when: datetime, model: str, envelope: dict) -> StepRecorded:
    return StepRecorded(
        event_id=derived_event_id("step.recorded", envelope["trajectory_id"], index),
        occurred_at=when,
        step_index=index,
        thought=step.thought,
        tool=step.tool,
        params=_jsonable(step.params),
        observation=step.observation,
        exit_code=step.exit_code,
        error=step.error,
        model=step.model or model,
        input_tokens=non_negative(step.input_tokens),
        output_tokens=non_negative(step.output_tokens),
        **envelope,
    )


def _jsonable(params: dict[str, Any]) -> dict[str, Any]:
    """Params as plain JSON values (logs can hold anything orjson can read, which is JSON already)."""
    return orjson.loads(orjson.dumps(params, default=str))


def _step_times(draft: EpisodeDraft, mtime: datetime) -> tuple[list[datetime], str]:
    """Times for [start, step 0..n-1, end] and where they came from.

    Log timestamps are used where present; a missing one is the previous time + 1 ms (or, with no
    earlier time at all, the file's mtime + index ms), so the sequence is deterministic.
    """
    logged = [draft.started_at, *(s.timestamp for s in draft.steps), draft.ended_at]
    known = sum(1 for t in logged if t is not None)
    if known == 0:
        return [mtime + timedelta(milliseconds=i) for i in range(len(logged))], "derived_from_mtime"
    first_known = next(t for t in logged if t is not None)
    out: list[datetime] = []
    for i, value in enumerate(logged):
        if value is not None:
            out.append(value)
        elif out:
            out.append(out[-1] + timedelta(milliseconds=1))
        else:
            out.append(first_known - timedelta(milliseconds=len(logged) - i))
    step_known = all(s.timestamp is not None for s in draft.steps)
    return out, "log" if step_known else "partial"


def count_steps(events: Iterable[EventBase]) -> int:
    return sum(1 for e in events if e.type == "step.recorded")

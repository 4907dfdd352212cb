"""The agent events of OTLP spans: a step span's `step.recorded`, a root span's `episode.started` /
`episode.ended`, and the end repeated (longer) when steps arrive after the root.

Ids are derived from the trace and span ids, so the same span twice is the same event; the step
index and the step count come from the trace's `TraceCursor` (which span gets which index is
`mapping`). Attribute meanings are `conventions`; no I/O.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from producers.gateway.otlp.conventions import first, llm_fields, task, text, tool_fields
from producers.gateway.otlp.spans import Span
from producers.gateway.otlp.step_cursor import TraceCursor
from schemas.events import EpisodeEnded, EpisodeStarted, EventBase, StepRecorded
from schemas.ids import derived_event_id

PRODUCER = "gateway/otlp"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _time(ns: int) -> datetime:
    return _EPOCH + timedelta(microseconds=ns // 1000)


def step_event(span: Span, index: int) -> StepRecorded:
    """The step of an LLM or tool span (docs/otlp.md has the table)."""
    a = span.attributes
    common = {
        "event_id": derived_event_id("step.recorded", "otlp", span.trace_id, span.span_id),
        "trajectory_id": span.trace_id,
        "occurred_at": _time(span.start_ns),
        "producer": PRODUCER,
        "step_index": index,
        "error": span.error,
        "latency_ms": round((span.end_ns - span.start_ns) / 1e6, 3),
        "policy_version": text(a.get("agentstream.policy_version")) or None,
    }
    if span.kind == "tool":
        return StepRecorded(**common, **tool_fields(a, span.name))
    return StepRecorded(**common, **llm_fields(a))


def episode_events(root: Span, trace: TraceCursor) -> list[EventBase]:
    """`episode.started` and `episode.ended` from the root span; the step count from the cursor."""
    a = {**root.resource, **root.attributes}
    session = first(a, "gen_ai.conversation.id", "session.id")
    started = EpisodeStarted(
        event_id=derived_event_id("episode.started", "otlp", root.trace_id),
        trajectory_id=root.trace_id,
        occurred_at=_time(root.start_ns),
        producer=PRODUCER,
        task_id=text(a.get("agentstream.task_id")) or root.name,
        task=task(a),
        domain=text(a.get("agentstream.domain")) or "generic",
        agent=text(first(a, "gen_ai.agent.name", "agent.name", "service.name")) or root.name,
        model=trace.model[1]
        if trace.model
        else str(first(a, "gen_ai.request.model", "llm.model_name") or ""),
        policy_version=text(a.get("agentstream.policy_version")) or None,
        group_id=text(a.get("agentstream.group_id")) or None,
        metadata={
            "otlp": {"trace_id": root.trace_id, "root_span_id": root.span_id, "root_span": root.name},
            **({"session_id": text(session)} if session is not None else {}),
        },
    )
    success = a.get("agentstream.success")
    score = a.get("agentstream.score")
    ended = EpisodeEnded(
        event_id=ended_event_id(root.trace_id, trace),
        trajectory_id=root.trace_id,
        occurred_at=_time(root.end_ns),
        producer=PRODUCER,
        success=success if isinstance(success, bool) else root.error is None,
        score=score if isinstance(score, int | float) and not isinstance(score, bool) else None,
        total_steps=trace.ended_with,
        error=root.error,
        outcome_source="agentstream.success" if isinstance(success, bool) else "otlp.status",
    )
    return [started, ended]


def ended_event_id(trace_id: str, trace: TraceCursor) -> str:
    """The first end of an episode keeps the id it always had; a later, longer one (steps that
    came after the root span) is another event, named by its step count."""
    first_end = trace.first_end
    if first_end is None or first_end.get("total_steps") == trace.ended_with:
        return derived_event_id("episode.ended", "otlp", trace_id)
    return derived_event_id("episode.ended", "otlp", trace_id, str(trace.ended_with))


def ended_again(trace: TraceCursor) -> EpisodeEnded:
    """The episode's end repeated with the cursor's (larger) step count: steps arrived after it."""
    first_end = trace.first_end or {}
    event_id = ended_event_id(str(first_end.get("trajectory_id")), trace)
    return EpisodeEnded.model_validate({**first_end, "event_id": event_id, "total_steps": trace.ended_with})

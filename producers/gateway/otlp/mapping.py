"""OTLP spans -> agent events: the pure core of the gateway's `POST /v1/traces` (docs/otlp.md).

Owns grouping one request's spans by trace and deciding, per trace, which span is the episode and
which are steps (with their indexes), returning `episode.started` / `step.recorded` /
`episode.ended` plus the spans that cannot be mapped, each with its reason. The parts it uses:
`spans` (the request decoded into `Span`s), `conventions` (what GenAI `gen_ai.*` and OpenInference
attributes mean), `events` (the events of a span), `step_cursor` (the indexes handed out). No I/O:
`producers.gateway.otlp.endpoint` is the HTTP shell that publishes what this returns.

The mapping in one paragraph: a trace is an episode (trajectory id = the hex trace id); LLM and tool
spans are steps (event id from trace + span id, so the same span twice is one event); the trace's
root span ends the episode (`episode.started` / `episode.ended` are emitted when it arrives, with
`total_steps`; a step span after it ends the episode again, longer); agent and chain spans below the
root carry no step. Step indexes must be contiguous from 0 for the rules and the assembler, and a
span's index cannot be computed from the span alone, so `StepCursor` hands them out per trace: by
start time within a request, in arrival order across requests, and the same index again for a span
it has seen. The gateway keeps it on disk (`producers.gateway.otlp.step_cursor.DurableStepCursor`,
written before the events are published), so a restart hands a span the index it had;
docs/otlp.md, "Ordering".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import ValidationError

from producers.gateway.otlp.conventions import unmapped_kind
from producers.gateway.otlp.events import ended_again, episode_events, step_event
from producers.gateway.otlp.spans import Span
from producers.gateway.otlp.step_cursor import StepCursor, TraceCursor
from schemas.codec import encode
from schemas.events import EventBase


@dataclass
class Mapped:
    """What one request became: events to publish, spans that cannot be mapped (with the reason),
    and how many structural spans (agent / chain below the root) carried no step."""

    events: list[EventBase] = field(default_factory=list)
    unmappable: list[tuple[Span, str]] = field(default_factory=list)
    structural: int = 0


def map_spans(spans: list[Span], cursor: StepCursor, max_event_bytes: int = 1_000_000) -> Mapped:
    """The events for `spans` (one request), and the spans that cannot be mapped with the reason.

    >>> from producers.gateway.otlp.spans import Span
    >>> llm = Span("ab" * 16, "01" * 8, "02" * 8, "chat m", 10**18, 10**18 + 5 * 10**8,
    ...            {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}, None)
    >>> root = Span("ab" * 16, "02" * 8, "", "invoke_agent a", 10**18, 10**18 + 10**9,
    ...             {"gen_ai.operation.name": "invoke_agent"}, None)
    >>> [(e.type, getattr(e, "step_index", None)) for e in map_spans([root, llm], StepCursor()).events]
    [('step.recorded', 0), ('episode.started', None), ('episode.ended', None)]
    """
    mapped = Mapped()
    by_trace: dict[str, list[Span]] = {}
    for span in spans:
        reason = _unusable(span)
        if reason:
            mapped.unmappable.append((span, reason))
        else:
            by_trace.setdefault(span.trace_id, []).append(span)
    for trace_id, trace_spans in by_trace.items():
        _map_trace(trace_spans, cursor.trace(trace_id), mapped, max_event_bytes)
    return mapped


def _unusable(span: Span) -> str | None:
    if len(span.trace_id) != 32 or span.trace_id == "0" * 32:
        return f"trace id {span.trace_id!r} is not 16 bytes"
    if len(span.span_id) != 16 or span.span_id == "0" * 16:
        return f"span id {span.span_id!r} is not 8 bytes"
    if span.start_ns <= 0 or span.end_ns < span.start_ns:
        return f"start/end time {span.start_ns}/{span.end_ns} ns: no start, or it ends before it starts"
    if not span.is_root and span.kind is None:
        return unmapped_kind(span.attributes)
    return None


def _map_trace(spans: list[Span], trace: TraceCursor, mapped: Mapped, max_bytes: int) -> None:
    """Steps in (start, end, span id) order, then the episode when the root span is here."""
    unique = {s.span_id: s for s in spans}.values()  # the same span twice in one request: once
    spans = sorted(unique, key=lambda s: (s.start_ns, s.end_ns, s.span_id))
    root = _root(spans, trace, mapped)
    for span in spans:
        if span.is_root and span is not root:
            continue  # a second root: a dead letter already
        if span.kind in ("llm", "tool"):
            _step(span, trace, mapped, max_bytes)
        elif not span.is_root:
            mapped.structural += 1
    if root is not None:
        if trace.ended_with is None:
            trace.root = root.span_id
        trace.ended_with = len(trace.indexes)
        try:
            events = episode_events(root, trace)
        except ValidationError as exc:
            mapped.unmappable.append((root, _validation_reason(exc)))
            return
        if trace.first_end is None:
            trace.first_end = events[1].model_dump(mode="json")
        mapped.events += events
    elif trace.first_end is not None and len(trace.indexes) > (trace.ended_with or 0):
        trace.ended_with = len(trace.indexes)  # steps after the root: the episode ends again, longer
        mapped.events.append(ended_again(trace))


def _root(spans: list[Span], trace: TraceCursor, mapped: Mapped) -> Span | None:
    """The episode span among `spans`: the first root, or the one that ended the episode before; any
    other root (two services of one trace both exporting here) is a dead letter."""
    roots = [s for s in spans if s.is_root]
    chosen = (
        roots[0]
        if roots and trace.root is None
        else next((s for s in roots if s.span_id == trace.root), None)
    )
    for other in (s for s in roots if s is not chosen):
        root = trace.root or chosen.span_id  # type: ignore[union-attr]
        mapped.unmappable.append((other, f"a second root span in the trace (the episode's is {root})"))
    return chosen


def _step(span: Span, trace: TraceCursor, mapped: Mapped, max_bytes: int) -> None:
    """The span's step; its index is taken only once the event is valid (no holes in the indexes)."""
    index = trace.indexes.get(span.span_id)
    try:
        event = step_event(span, len(trace.indexes) if index is None else index)
    except ValidationError as exc:
        mapped.unmappable.append((span, _validation_reason(exc)))
        return
    size = len(encode(event))
    if size > max_bytes:
        mapped.unmappable.append((span, f"its step.recorded event would be {size} bytes, over {max_bytes}"))
        return
    trace.indexes.setdefault(span.span_id, event.step_index)
    if event.model and (trace.model is None or event.step_index < trace.model[0]):
        trace.model = (event.step_index, event.model)
    mapped.events.append(event)


def _validation_reason(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())

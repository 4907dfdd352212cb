"""OTLP traces -> agent events: the pure core of the gateway's `POST /v1/traces` (docs/otlp.md).

Owns: decoding an `ExportTraceServiceRequest` (OTLP/HTTP protobuf, or OTLP JSON with hex ids),
reading each span as the OpenTelemetry GenAI conventions (`gen_ai.*`) or OpenInference
(`openinference.span.kind`) describe it, and turning spans into `episode.started` /
`step.recorded` / `episode.ended` plus the spans that cannot be mapped, each with its reason.
No I/O: `producers.gateway.otlp.endpoint` is the HTTP shell that publishes what this returns.

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

import base64
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from pydantic import ValidationError

from producers.gateway.otlp.step_cursor import StepCursor, TraceCursor
from schemas.codec import encode
from schemas.events import EpisodeEnded, EpisodeStarted, EventBase, StepRecorded
from schemas.ids import derived_event_id

PRODUCER = "gateway/otlp"
MEDIA_TYPES = {
    "application/x-protobuf": "protobuf",
    "application/protobuf": "protobuf",
    "application/json": "json",
}
OPENINFERENCE_KINDS = {"LLM": "llm", "TOOL": "tool", "AGENT": "agent", "CHAIN": "chain"}
GENAI_OPERATIONS = {
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
    "execute_tool": "tool",
    "invoke_agent": "agent",
    "create_agent": "agent",
    "invoke_workflow": "chain",
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_IDS = ("traceId", "spanId", "parentSpanId")
_REMOTE_PARENT = 0x300  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK | SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK


@dataclass(frozen=True)
class Span:
    """One OTLP span as plain values (ids as lowercase hex, attributes as Python values)."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    error: str | None  # status ERROR: its message (or the exception / error.type)
    resource: dict[str, Any] = field(default_factory=dict)
    remote_parent: bool = False  # its parent is in another process (OTLP span flags)
    message: Any = field(default=None, compare=False, repr=False)  # the protobuf Span, for dead letters

    @property
    def is_root(self) -> bool:
        """The trace's top span here: no parent, or a parent in another process (the trace came in
        over the network from a caller that is not exporting to us)."""
        return not self.parent_id or self.remote_parent

    @property
    def kind(self) -> str | None:
        """llm | tool | agent | chain, or None when neither convention names it."""
        oi = self.attributes.get("openinference.span.kind")
        if isinstance(oi, str):
            return OPENINFERENCE_KINDS.get(oi.upper())
        op = self.attributes.get("gen_ai.operation.name")
        if isinstance(op, str):
            return GENAI_OPERATIONS.get(op)
        if "gen_ai.request.model" in self.attributes or "gen_ai.system" in self.attributes:
            return "llm"
        return None


@dataclass
class Mapped:
    """What one request became: events to publish, spans that cannot be mapped (with the reason),
    and how many structural spans (agent / chain below the root) carried no step."""

    events: list[EventBase] = field(default_factory=list)
    unmappable: list[tuple[Span, str]] = field(default_factory=list)
    structural: int = 0


# --- decoding --------------------------------------------------------------------------------------


def request_to_json(request) -> bytes:
    """OTLP JSON for a request (hex ids, lowerCamelCase): what JSON exporters send."""
    from google.protobuf import json_format

    obj = json_format.MessageToDict(request)
    for resource_spans in obj.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for target in (span, *span.get("links", [])):
                    for key in _IDS:
                        if target.get(key):
                            target[key] = base64.b64decode(target[key]).hex()
    return orjson.dumps(obj)


def spans_of(request) -> list[Span]:
    """Every span of a request, with its resource's attributes."""
    out = []
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(_span(span, resource))
    return out


def _span(span, resource: dict[str, Any]) -> Span:
    attrs = attributes(span.attributes)
    error = None
    if span.status.code == 2:  # STATUS_CODE_ERROR
        error = span.status.message or _exception(span) or str(attrs.get("error.type") or "error")
    return Span(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        name=span.name,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        attributes=attrs,
        error=error,
        resource=resource,
        remote_parent=span.flags & _REMOTE_PARENT == _REMOTE_PARENT,
        message=span,
    )


def _exception(span) -> str | None:
    for event in span.events:
        if event.name == "exception":
            attrs = attributes(event.attributes)
            return f"{attrs.get('exception.type', 'Exception')}: {attrs.get('exception.message', '')}"
    return None


def attributes(key_values) -> dict[str, Any]:
    """OTLP KeyValues as a dict of Python values."""
    return {kv.key: any_value(kv.value) for kv in key_values}


def any_value(value) -> Any:
    """An OTLP AnyValue as a Python value (bytes as hex)."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return attributes(value.kvlist_value.values)
    if which == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, which)


def span_json(span: Span) -> bytes:
    """A dead letter's payload: the span as OTLP JSON (hex ids), its resource attributes and its
    trajectory id (the hex trace id, which the letter is keyed by)."""
    from google.protobuf import json_format

    obj = json_format.MessageToDict(span.message) if span.message is not None else {"name": span.name}
    obj.update(traceId=span.trace_id, spanId=span.span_id, parentSpanId=span.parent_id)
    body = {"trajectory_id": span.trace_id, "resource": span.resource, "span": obj}
    return orjson.dumps(body, default=str)


# --- spans -> events -------------------------------------------------------------------------------


def map_spans(spans: list[Span], cursor: StepCursor, max_event_bytes: int = 1_000_000) -> Mapped:
    """The events for `spans` (one request), and the spans that cannot be mapped with the reason.

    >>> from producers.gateway.otlp.mapping import Span
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
        oi = span.attributes.get("openinference.span.kind")
        op = span.attributes.get("gen_ai.operation.name")
        if oi is not None or op is not None:
            return f"span kind {oi or op!r} is not mapped (LLM/chat, TOOL/execute_tool, AGENT, CHAIN are)"
        return "neither gen_ai.operation.name nor openinference.span.kind: not a GenAI span"
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
        "policy_version": _text(a.get("agentstream.policy_version")) or None,
    }
    if span.kind == "tool":
        return StepRecorded(**common, **_tool_fields(span))
    return StepRecorded(**common, **_llm_fields(a))


def _tool_fields(span: Span) -> dict[str, Any]:
    a = span.attributes
    name = a.get("gen_ai.tool.name") or a.get("tool.name") or span.name.removeprefix("execute_tool ")
    args = _first(a, "gen_ai.tool.call.arguments", "input.value")
    result = _first(a, "gen_ai.tool.call.result", "output.value")
    return {"tool": str(name), "params": _params(args), "observation": _text(result)}


def _llm_fields(a: dict[str, Any]) -> dict[str, Any]:
    text, calls, finish = _output(a)
    reasons = a.get("gen_ai.response.finish_reasons")
    if finish is None and isinstance(reasons, list) and reasons:
        finish = str(reasons[0])
    return {
        "thought": text,
        "params": {"tool_calls": calls} if calls else {},
        "model": str(_first(a, "gen_ai.response.model", "gen_ai.request.model", "llm.model_name") or ""),
        "input_tokens": _first(
            a, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt"
        ),
        "output_tokens": _first(
            a, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion"
        ),
        "finish_reason": finish,
    }


def _output(a: dict[str, Any]) -> tuple[str, list[dict], str | None]:
    """The model's text, its tool calls and finish reason: gen_ai.output.messages, else OpenInference
    llm.output_messages.*, else output.value."""
    messages = _json_value(a.get("gen_ai.output.messages"))
    if isinstance(messages, list):
        texts, calls, finish = [], [], None
        for message in (m for m in messages if isinstance(m, dict)):
            finish = finish or message.get("finish_reason")
            for part in (p for p in message.get("parts") or [] if isinstance(p, dict)):
                if part.get("type") == "text":
                    texts.append(_text(part.get("content")))
                elif part.get("type") == "tool_call":
                    calls.append({"name": part.get("name"), "arguments": _params(part.get("arguments"))})
        return "\n".join(texts), calls, finish
    texts, calls = [], []
    for i in range(64):
        prefix = f"llm.output_messages.{i}.message."
        if not any(k.startswith(prefix) for k in a):
            break
        texts += [_text(a[prefix + "content"])] if prefix + "content" in a else []
        for j in range(64):
            name = a.get(f"{prefix}tool_calls.{j}.tool_call.function.name")
            if name is None:
                break
            calls.append(
                {
                    "name": name,
                    "arguments": _params(a.get(f"{prefix}tool_calls.{j}.tool_call.function.arguments")),
                }
            )
    if not texts and not calls:
        texts = [_text(a.get("output.value"))] if a.get("output.value") is not None else []
    return "\n".join(texts), calls, None


def episode_events(root: Span, trace: TraceCursor) -> list[EventBase]:
    """`episode.started` and `episode.ended` from the root span; the step count from the cursor."""
    a = {**root.resource, **root.attributes}
    session = _first(a, "gen_ai.conversation.id", "session.id")
    started = EpisodeStarted(
        event_id=derived_event_id("episode.started", "otlp", root.trace_id),
        trajectory_id=root.trace_id,
        occurred_at=_time(root.start_ns),
        producer=PRODUCER,
        task_id=_text(a.get("agentstream.task_id")) or root.name,
        task=_task(a),
        domain=_text(a.get("agentstream.domain")) or "generic",
        agent=_text(_first(a, "gen_ai.agent.name", "agent.name", "service.name")) or root.name,
        model=trace.model[1]
        if trace.model
        else str(_first(a, "gen_ai.request.model", "llm.model_name") or ""),
        policy_version=_text(a.get("agentstream.policy_version")) or None,
        group_id=_text(a.get("agentstream.group_id")) or None,
        metadata={
            "otlp": {"trace_id": root.trace_id, "root_span_id": root.span_id, "root_span": root.name},
            **({"session_id": _text(session)} if session is not None else {}),
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
    first = trace.first_end
    if first is None or first.get("total_steps") == trace.ended_with:
        return derived_event_id("episode.ended", "otlp", trace_id)
    return derived_event_id("episode.ended", "otlp", trace_id, str(trace.ended_with))


def ended_again(trace: TraceCursor) -> EpisodeEnded:
    """The episode's end repeated with the cursor's (larger) step count: steps arrived after it."""
    first = trace.first_end or {}
    event_id = ended_event_id(str(first.get("trajectory_id")), trace)
    return EpisodeEnded.model_validate({**first, "event_id": event_id, "total_steps": trace.ended_with})


def _task(a: dict[str, Any]) -> str:
    messages = _json_value(a.get("gen_ai.input.messages"))
    if isinstance(messages, list):
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        parts = [p for m in users[-1:] for p in m.get("parts") or [] if isinstance(p, dict)]
        return "\n".join(_text(p.get("content")) for p in parts if p.get("type") == "text")
    return _text(_first(a, "agentstream.task", "input.value"))


# --- values ----------------------------------------------------------------------------------------


def _first(a: dict[str, Any], *keys: str) -> Any:
    return next((a[k] for k in keys if a.get(k) is not None), None)


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else orjson.dumps(value, default=str).decode()


def _json_value(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    return value


def _params(value: Any) -> dict[str, Any]:
    """Tool arguments as a dict: a JSON object (or its text); anything else as {"input": value}."""
    parsed = _json_value(value) if isinstance(value, str) else value
    if isinstance(parsed, dict):
        return parsed
    return {} if value is None or value == "" else {"input": parsed if parsed is not None else value}

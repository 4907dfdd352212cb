"""OTLP requests as `Span` values, and spans back as OTLP JSON.

Owns the wire side of `POST /v1/traces`: the body encodings it accepts, reading an
`ExportTraceServiceRequest` into `Span`s (ids as lowercase hex, attributes and AnyValues as Python
values, the error of a failed span), and writing OTLP JSON again (`request_to_json` for clients
and tests, `span_json` for a dead letter). What a span means is `conventions`; no I/O.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import orjson

from producers.gateway.otlp.conventions import span_kind

MEDIA_TYPES = {
    "application/x-protobuf": "protobuf",
    "application/protobuf": "protobuf",
    "application/json": "json",
}
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
        return span_kind(self.attributes)


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


def span_json(span: Span) -> bytes:
    """A dead letter's payload: the span as OTLP JSON (hex ids), its resource attributes and its
    trajectory id (the hex trace id, which the letter is keyed by)."""
    from google.protobuf import json_format

    obj = json_format.MessageToDict(span.message) if span.message is not None else {"name": span.name}
    obj.update(traceId=span.trace_id, spanId=span.span_id, parentSpanId=span.parent_id)
    body = {"trajectory_id": span.trace_id, "resource": span.resource, "span": obj}
    return orjson.dumps(body, default=str)

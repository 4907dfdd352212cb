"""The gateway's OTLP/HTTP endpoint: `POST /v1/traces` (aiohttp), the HTTP shell around the pure
mapping in `producers.gateway.otlp.mapping` (docs/otlp.md).

Same API keys and size limits as `/v1/events` (`--max-body-bytes` on the body after gzip is undone,
`--max-events` on the spans of one request). Bodies: `application/x-protobuf` or `application/json`
(OTLP JSON: hex ids), `Content-Encoding: gzip` accepted (any other encoding: 415). Answers:
- 200 with an `ExportTraceServiceResponse` in the request's encoding, only after the broker
  acknowledged every event and every dead letter of the request; spans that cannot be mapped are
  counted in `partial_success.rejected_spans` (the exporter must not resend them) and are in
  `agentstream.dlq` with the trace and span ids and the reason.
- 400 malformed payload (not OTLP, bad JSON, a broken or truncated gzip stream, a non-hex id) with
  the reason; nothing of it is written to any topic. 401 / 413 / 415 as on `/v1/events`.
- 503 when the broker did not acknowledge (the body of `/v1/events`' 503; OTLP exporters retry it).

Events and dead letters go through the gateway's own `_publish` / `_send_dead_letters` (redaction
included), which `create_app` passes to `add_otlp_routes` (the gateway imports this module, so this
module cannot import them). The step cursor lives in the application, one per gateway process:
`producers.gateway.otlp.step_cursor.DurableStepCursor` on disk under the data directory, or
`producers.gateway.otlp.step_cursor.StepCursor` in memory when no path is configured (benchmarks).
"""

from __future__ import annotations

import base64
import logging
import uuid
from typing import Any

import orjson

from producers.errors import RequestRejected
from producers.gateway.otlp.mapping import Mapped, map_spans
from producers.gateway.otlp.spans import MEDIA_TYPES, span_json, spans_of
from producers.gateway.otlp.step_cursor import DurableStepCursor, StepCursor
from producers.gateway.requests import (
    GatewayConfig,
    content_encoding,
    decoded_body,
    field_error,
    key_allowed,
    presented_key,
    too_large,
)
from schemas.json_input import json_object

log = logging.getLogger(__name__)

_IDS = ("traceId", "spanId", "parentSpanId")


def add_otlp_routes(app, publish, send_dead_letters) -> None:
    """Add `POST /v1/traces` to the gateway's aiohttp application.

    `publish(request, events, request_id)` and `send_dead_letters(request, [(reason, payload)])` are
    the gateway's own `_publish` and `_send_dead_letters` (passed in by `create_app`: importing them
    here would be an import cycle)."""
    path = getattr(app["config"], "otlp_cursor_path", None)
    app["otlp_cursor"] = DurableStepCursor(path) if path else StepCursor()  # None: in memory (benchmarks)
    app["otlp_publish"] = publish
    app["otlp_dead_letters"] = send_dead_letters
    app.router.add_post("/v1/traces", _post_traces)

    async def _close_cursor(app_) -> None:
        getattr(app_["otlp_cursor"], "close", lambda: None)()

    app.on_cleanup.append(_close_cursor)


async def _post_traces(request):
    config: GatewayConfig = request.app["config"]
    request_id = str(uuid.uuid4())
    try:
        media = _media(request, config)
        body = await _read(request, config)
        spans = spans_of(decode_request(body, media))
        if len(spans) > config.max_events:
            message = f"{len(spans)} spans exceed the limit of {config.max_events} per request"
            raise RequestRejected(413, "too many spans", [field_error(None, "$", len(spans), message)])
    except RequestRejected as rejected:
        headers = {"WWW-Authenticate": 'Bearer realm="agentstream"'} if rejected.status == 401 else None
        return _json(rejected.status, {**rejected.body, "request_id": request_id}, headers)
    cursor: StepCursor = request.app["otlp_cursor"]
    mapped = map_spans(spans, cursor, config.max_event_bytes)
    cursor.save()  # the indexes this request handed out are on disk before any event is published
    events = cursor.unacknowledged(mapped.events)
    if events:
        published = await request.app["otlp_publish"](request, events, request_id)
        if published.status != 202:
            return published
        cursor.acknowledged(events)
    if (
        mapped.unmappable
        and config.dead_letters
        and not await _dead_letter_spans(request, mapped, request_id)
    ):
        message = f"{len(mapped.unmappable)} dead letters of unmappable spans not acknowledged; resend"
        body = {
            "error": "broker did not acknowledge",
            "accepted": 0,
            "request_id": request_id,
            "message": message,
        }
        return _json(503, body, {"Retry-After": "1"})
    return _answer(media, mapped)


def _media(request, config: GatewayConfig) -> str:
    """Check the key, the media type, the encoding and the announced length; the body's kind."""
    if not config.allow_anonymous and not key_allowed(presented_key(request.headers), config.api_key_hashes):
        raise RequestRejected(
            401, "unauthorized", message="missing or wrong API key (Authorization: Bearer KEY)"
        )
    media = MEDIA_TYPES.get(request.content_type)
    if media is None:
        message = (
            f"content type must be application/x-protobuf or application/json, got {request.content_type!r}"
        )
        raise RequestRejected(
            415, "unsupported media type", [field_error(None, "Content-Type", request.content_type, message)]
        )
    content_encoding(request.headers)
    length = request.content_length
    if length is not None and length > config.max_body_bytes:
        raise too_large(length, config.max_body_bytes)
    return media


async def _read(request, config: GatewayConfig) -> bytes:
    """The body with gzip undone here (the gateway turns aiohttp's decompression off, so that an
    encoding it does not take is a 415 and not its parser's plain-text 400); the size limit applies
    to the compressed and to the decompressed bytes."""
    from aiohttp import web
    from aiohttp.web_protocol import RequestPayloadError

    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large(None, config.max_body_bytes) from None
    except RequestPayloadError as exc:
        raise RequestRejected(400, "malformed OTLP payload", message=f"cannot read the body: {exc}") from None
    return decoded_body(body, content_encoding(request.headers), config.max_body_bytes)


def decode_request(body: bytes, media: str):
    """An `ExportTraceServiceRequest` from a protobuf or OTLP JSON body; RequestRejected(400) else."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    try:
        if media == "protobuf":
            request.ParseFromString(body)
        else:
            document = json_object(body, "OTLP JSON body", malformed)
            json_format.ParseDict(_json_ids_to_base64(document), request, ignore_unknown_fields=True)
    except (DecodeError, json_format.ParseError, ValueError, TypeError) as exc:
        raise malformed(f"not an OTLP {media} ExportTraceServiceRequest: {exc}") from None
    return request


def malformed(message: str) -> RequestRejected:
    return RequestRejected(400, "malformed OTLP payload", message=message)


def _json_ids_to_base64(obj: dict) -> dict:
    """OTLP JSON writes ids as hex; protobuf's JSON mapping expects base64 for bytes fields."""
    for r, resource_spans in enumerate(obj.get("resourceSpans") or []):
        for s, scope_spans in enumerate(_dicts(resource_spans, "scopeSpans")):
            for i, span in enumerate(_dicts(scope_spans, "spans")):
                where = f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]"
                _hex_fields(span, where)
                for j, link in enumerate(_dicts(span, "links")):
                    _hex_fields(link, f"{where}.links[{j}]")
    return obj


def _dicts(obj: Any, key: str) -> list[dict]:
    items = obj.get(key) if isinstance(obj, dict) else None
    return [x for x in items if isinstance(x, dict)] if isinstance(items, list) else []


def _hex_fields(obj: dict, where: str) -> None:
    for key in _IDS:
        value = obj.get(key)
        if not value:
            continue
        try:
            obj[key] = base64.b64encode(bytes.fromhex(value)).decode()
        except (ValueError, TypeError):
            raise malformed(f"{where}.{key}: expected a hex id, got {str(value)[:40]!r}") from None


async def _dead_letter_spans(request, mapped: Mapped, request_id: str) -> bool:
    """Unmappable spans to the DLQ: the reason names the trace and span ids, the payload is the span as
    OTLP JSON with `trajectory_id` (the hex trace id, the letter's key). True once all are acknowledged."""
    payloads = []
    for span, reason in mapped.unmappable:
        text = f"otlp trace {span.trace_id} span {span.span_id} ({span.name!r}): {reason}"
        log.info("gateway request %s: dead letter: %s", request_id, text)
        payloads.append((text, span_json(span)))
    return await request.app["otlp_dead_letters"](request, payloads)


# --- responses ---


def _json(status: int, body: dict, headers: dict | None = None):
    from aiohttp import web

    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


def _answer(media: str, mapped: Mapped):
    """200 with an ExportTraceServiceResponse (partial success names the rejected spans)."""
    from aiohttp import web
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    response = ExportTraceServiceResponse()
    if mapped.unmappable:
        response.partial_success.rejected_spans = len(mapped.unmappable)
        reasons = sorted({reason for _, reason in mapped.unmappable})
        response.partial_success.error_message = (
            f"{len(mapped.unmappable)} spans cannot be mapped (in agentstream.dlq): " + "; ".join(reasons[:5])
        )
    if media == "protobuf":
        return web.Response(body=response.SerializeToString(), content_type="application/x-protobuf")
    return web.json_response(json_format.MessageToDict(response))

"""`agentstream gateway`: HTTP ingestion for agents in any language (aiohttp).

Endpoints:
- `POST /v1/events`: a JSON array of events (the models in `schemas/events/`, checked with
  `schemas.codec.validate(obj, strict=True)`; accepted types: `episode.started`, `step.recorded`,
  `episode.ended` -> `agent.events`, and `feedback.annotation` -> `feedback.human`).
  Answers `202 {"accepted": n, "event_ids": [...]}` only after the broker acknowledged every event
  (acks=all).
- `GET /openapi.json`: an OpenAPI 3.1 document embedding the event JSON Schemas.
- `GET /healthz`: 200 when the broker answers and publishing works, 503 otherwise (also while the
  last publish failed as a whole: a producer that failed for a reason other than time is replaced,
  so the next request tries a fresh one).

Policy for bad input: ALL-OR-NOTHING. If any event of a request is invalid, no event of that request
is written to its topic: the answer is `400 {"accepted": 0, "errors": [{"index", "field", "value",
"message"}, ...]}` listing every problem of every event; the invalid events (not the valid ones)
also go to `agentstream.dlq` with the reason (stage `gateway`, no source topic). Fix and resend the
whole request. Other answers: 401 (missing or wrong API key; keys are configured as sha256 hex
hashes and compared in constant time), 413 (body over `max_body_bytes`, or more than `max_events`),
415 (content type not `application/json`), 400 for malformed JSON (naming line, column and byte
position), 503 when the broker did not acknowledge in time: that is the only case where part of a
request may have been written, and the body says which event ids were acknowledged. Resending the
same events is safe: event ids identify events and every consumer deduplicates on them.

The gateway does not spool: an answer of 202 means the events are on the broker; 503 means retry.

Redaction: every event published (`/v1/events` and the OTLP route, both through `_publish`) and
every dead letter passes the process's redactor first (`producers.redaction`, configured by the
settings file): secrets are replaced by `[REDACTED:<detector>]` and counted in `redactions`. The
202 answer's event ids are unchanged.

This module is the HTTP shell (aiohttp handlers, `create_app`, `serve`). The pure core - config,
API keys, body -> events or errors - is `producers.gateway.requests`; sending to Kafka is
`producers.gateway.publishers`; the OpenAPI document is `producers.gateway.openapi`. Import their names
from those modules.
"""

from __future__ import annotations

import logging
import uuid

import orjson

from clients.kafka import broker_reachable
from producers.errors import RequestRejected
from producers.gateway.publishers import make_publisher
from producers.gateway.requests import (
    POLICY,
    STAGE,
    GatewayConfig,
    check_events,
    content_encoding,
    decoded_body,
    field_error,
    key_allowed,
    parse_body,
    presented_key,
    too_large,
)
from producers.http import serve_app
from producers.redaction import Redactor
from producers.redaction_settings import load_redactor
from schemas.codec import encode, encode_key
from schemas.topics import DLQ, topic_for

__all__ = ["create_app", "serve"]

log = logging.getLogger(__name__)


# --- the HTTP shell --------------------------------------------------------------------------------


def create_app(config: GatewayConfig, publisher=None, redactor: Redactor | None = None):
    """The aiohttp application (publisher and redactor injectable for benchmarks and tests)."""
    from aiohttp import web

    if redactor is None:
        from schemas.settings import Settings

        redactor = load_redactor(config.settings_file, Settings().data_dir)
    publisher = publisher or make_publisher(config)
    # gzip is undone by the handlers (`decoded_body`): aiohttp's own decompression answers an encoding
    # it does not know with a plain-text 400 from its parser, before any handler could say 415
    app = web.Application(client_max_size=config.max_body_bytes, handler_args={"auto_decompress": False})
    app["config"], app["publisher"], app["redactor"] = config, publisher, redactor
    app.router.add_post("/v1/events", _post_events)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/openapi.json", _openapi)
    from producers.gateway.otlp.endpoint import add_otlp_routes

    add_otlp_routes(app, _publish, _send_dead_letters)  # POST /v1/traces: spans as episodes and steps

    async def _close(app_):
        await publisher.close()

    app.on_cleanup.append(_close)
    return app


def _json(status: int, body: dict, headers: dict | None = None):
    from aiohttp import web

    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


async def _post_events(request):
    config: GatewayConfig = request.app["config"]
    request_id = str(uuid.uuid4())
    try:
        body = await _checked_body(request, config)
        try:
            items = parse_body(body, config.max_events)
        except RequestRejected as rejected:
            if rejected.status == 400 and rejected.body["error"] == "malformed JSON":
                await _dead_letter_body(request, body, rejected.body["errors"][0]["message"], request_id)
            raise
        events, errors = check_events(items, config.max_event_bytes)
        if errors:
            dead = await _dead_letter_items(request, items, errors, request_id, body)
            raise RequestRejected(
                400, "invalid events", errors, rejected=len({e["index"] for e in errors}),
                valid_not_written=len(events), policy=POLICY, dead_lettered=dead, request_id=request_id,
            )  # fmt: skip
    except RequestRejected as rejected:
        headers = {"WWW-Authenticate": 'Bearer realm="agentstream"'} if rejected.status == 401 else None
        return _json(rejected.status, rejected.body, headers)
    return await _publish(request, events, request_id)


async def _checked_body(request, config: GatewayConfig) -> bytes:
    from aiohttp import web

    if not config.allow_anonymous and not key_allowed(presented_key(request.headers), config.api_key_hashes):
        raise RequestRejected(
            401, "unauthorized", message="missing or wrong API key (Authorization: Bearer KEY)"
        )
    if request.content_type != "application/json":
        message = f"content type must be application/json, got {request.content_type!r}"
        raise RequestRejected(
            415, "unsupported media type", [field_error(None, "Content-Type", request.content_type, message)]
        )
    encoding = content_encoding(request.headers)
    length = request.content_length
    if length is not None and length > config.max_body_bytes:
        raise too_large(length, config.max_body_bytes)
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large(None, config.max_body_bytes) from None
    return decoded_body(body, encoding, config.max_body_bytes)


async def _publish(request, events: list, request_id: str):
    publisher = request.app["publisher"]
    events = [request.app["redactor"].redact_event(e) for e in events]
    records = [(topic_for(e.type), encode_key(e), encode(e)) for e in events]
    try:
        results = await publisher.send_all(records)
    except Exception as exc:
        log.warning("gateway request %s: broker unavailable: %s", request_id, exc)
        results = [exc] * len(records)
    failed = [e.event_id for e, r in zip(events, results, strict=True) if r is not None]
    if failed:
        acked = [e.event_id for e, r in zip(events, results, strict=True) if r is None]
        reason = next(repr(r) for r in results if r is not None)
        log.warning(
            "gateway request %s: %d of %d events not acknowledged: %s",
            request_id,
            len(failed),
            len(events),
            reason,
        )
        body = {
            "error": "broker did not acknowledge",
            "accepted": 0,
            "partial": bool(acked),
            "acknowledged_event_ids": acked,
            "unacknowledged_event_ids": failed,
            "message": f"{reason}; resend the request: event ids make the resend idempotent downstream",
            "request_id": request_id,
        }
        return _json(503, body, {"Retry-After": "1"})
    return _json(
        202, {"accepted": len(events), "event_ids": [e.event_id for e in events], "request_id": request_id}
    )


async def _dead_letter_items(request, items: list, errors: list[dict], request_id: str, body: bytes) -> bool:
    by_index: dict[int, list[str]] = {}
    for err in errors:
        by_index.setdefault(err["index"], []).append(f"{err['field']}: {err['message']}")
    payloads = [
        (f"gateway request {request_id} event #{i}: " + "; ".join(reasons), _item_bytes(items[i], body))
        for i, reasons in sorted(by_index.items())
    ]
    return await _send_dead_letters(request, payloads)


def _item_bytes(item, body: bytes) -> bytes:
    """The refused event as JSON; orjson cannot write one nested past 254 levels, and then the whole
    request body stands for it (the dead letter keeps a bounded prefix of either)."""
    try:
        return orjson.dumps(item, default=str)
    except TypeError:
        return body


async def _dead_letter_body(request, body: bytes, reason: str, request_id: str) -> bool:
    return await _send_dead_letters(request, [(f"gateway request {request_id}: {reason}", body)])


async def _send_dead_letters(request, payloads: list[tuple[str, bytes]]) -> bool:
    """Write rejected input to the DLQ; returns whether the broker acknowledged all of it."""
    from schemas.deadletter import dead_letter

    if not request.app["config"].dead_letters:
        return False
    redactor: Redactor = request.app["redactor"]
    letters = [
        dead_letter(
            STAGE, redactor.redact_text(reason)[0], redactor.redact_bytes(payload), error_type="DecodeError"
        )
        for reason, payload in payloads
    ]
    try:
        results = await request.app["publisher"].send_all([(DLQ, encode_key(d), encode(d)) for d in letters])
    except Exception as exc:
        log.error("gateway: cannot write %d dead letters to %s: %s", len(letters), DLQ, exc)
        return False
    return all(r is None for r in results)


async def _healthz(request):
    """200 when the broker answers and the last publish did not fail as a whole; 503 otherwise."""
    config: GatewayConfig = request.app["config"]
    reachable = await broker_reachable(config.bootstrap_servers)
    publishing = getattr(request.app["publisher"], "healthy", True)
    status = "broker unreachable" if not reachable else "ok" if publishing else "publishing failing"
    return _json(200 if status == "ok" else 503, {"status": status, "broker": config.bootstrap_servers})


async def _openapi(request):
    from producers.gateway.openapi import openapi_document

    return _json(200, openapi_document(request.app["config"]))


# --- running ---------------------------------------------------------------------------------------


async def serve(config: GatewayConfig, host: str, port: int, ready_file: str | None = None) -> None:
    """Run the gateway until SIGTERM/SIGINT; writes "host:port" to `ready_file` once listening."""
    await serve_app(
        create_app(config),
        host,
        port,
        ready_file,
        "gateway",
        header_timeout_s=config.header_timeout_s,
        body_timeout_s=config.body_timeout_s,
    )

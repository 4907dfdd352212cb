"""`agentstream gateway`: HTTP ingestion for agents in any language (aiohttp).

Endpoints:
- `POST /v1/events`: a JSON array of events (the models in `schemas/events.py`, checked with
  `schemas.codec.validate(obj, strict=True)`; accepted types: `episode.started`, `step.recorded`,
  `episode.ended` -> `agent.events`, and `feedback.annotation` -> `feedback.human`).
  Answers `202 {"accepted": n, "event_ids": [...]}` only after the broker acknowledged every event
  (acks=all).
- `GET /openapi.json`: an OpenAPI 3.1 document embedding the event JSON Schemas.
- `GET /healthz`: 200 when the broker answers, 503 otherwise.

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
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import signal
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from producers.errors import ProducerError
from schemas.codec import encode, encode_key, validate
from schemas.errors import DecodeError
from schemas.events import EVENT_MODELS
from schemas.topics import DLQ, topic_for

log = logging.getLogger(__name__)

STAGE = "gateway"
ACCEPTED_TYPES = ("episode.started", "step.recorded", "episode.ended", "feedback.annotation")
POLICY = "all-or-nothing: a request with any invalid event writes none of its events"


@dataclass(frozen=True)
class GatewayConfig:
    bootstrap_servers: str
    api_key_hashes: frozenset[str] = frozenset()
    allow_anonymous: bool = False
    max_body_bytes: int = 4 * 1024 * 1024
    max_events: int = 10_000
    max_event_bytes: int = 1_000_000  # Apache Kafka's default message.max.bytes
    ack_timeout_s: float = 30.0
    client: str = "kafka-python"  # measured faster than aiokafka here (agentstream bench produce)
    dead_letters: bool = True
    linger_ms: int = 2

    def __post_init__(self):
        if not self.api_key_hashes and not self.allow_anonymous:
            raise ProducerError(
                "api_key_hashes: no API key hashes configured (--api-key-hashes or "
                "AGENTSTREAM_GATEWAY_API_KEY_HASHES, comma-separated sha256 hex); refusing to accept "
                "anonymous events (pass --allow-anonymous to do so on purpose)"
            )
        for digest in self.api_key_hashes:
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ProducerError(f"api_key_hashes: expected sha256 hex digests, got {digest[:12]!r}...")
        if self.client not in ("aiokafka", "kafka-python"):
            raise ProducerError(f"client: expected 'aiokafka' or 'kafka-python', got {self.client!r}")


def hash_key(key: str) -> str:
    """The sha256 hex digest to configure for an API key.

    >>> hash_key("secret")[:16]
    '2bb80d537b1da3e3'
    """
    return hashlib.sha256(key.encode()).hexdigest()


def parse_key_hashes(text: str | None) -> frozenset[str]:
    """Comma-separated sha256 hex digests (whitespace and case ignored).

    >>> sorted(parse_key_hashes(" AB" + "0" * 62 + ", "))
    ['ab00000000000000000000000000000000000000000000000000000000000000']
    """
    return frozenset(part.strip().lower() for part in (text or "").split(",") if part.strip())


def key_allowed(presented: str | None, hashes: frozenset[str]) -> bool:
    """Whether `presented` hashes to one of `hashes` (constant-time compare against every hash)."""
    if not presented:
        return False
    digest = hash_key(presented)
    ok = False
    for candidate in hashes:
        ok |= hmac.compare_digest(digest, candidate)
    return ok


def presented_key(headers) -> str | None:
    """The API key of a request: `Authorization: Bearer KEY` or `X-API-Key: KEY`."""
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("X-API-Key")


# --- the pure core: body -> events or errors --------------------------------------------------------


class RequestRejected(Exception):
    """A request answered with a 4xx; `body` is the JSON answer."""

    def __init__(self, status: int, error: str, errors: list[dict] | None = None, **extra: Any):
        self.status = status
        self.body = {"error": error, "accepted": 0, "errors": errors or [], **extra}
        super().__init__(f"{status} {error}")


def parse_body(body: bytes, max_events: int) -> list[Any]:
    """The JSON array of a request body; malformed JSON names the position of the problem."""
    try:
        items = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        message = f"malformed JSON at line {exc.lineno} column {exc.colno} (byte {exc.pos}): {exc.msg}"
        raise RequestRejected(
            400, "malformed JSON", [_error(None, "$", _preview(body, exc.pos), message)]
        ) from None
    if not isinstance(items, list):
        raise RequestRejected(
            400,
            "not a JSON array",
            [_error(None, "$", _preview_value(items), "expected a JSON array of events")],
        )
    if not items:
        raise RequestRejected(400, "no events", [_error(None, "$", [], "the array is empty")])
    if len(items) > max_events:
        message = f"{len(items)} events exceed the limit of {max_events} per request"
        raise RequestRejected(413, "too many events", [_error(None, "$", len(items), message)])
    return items


def check_events(items: list[Any], max_event_bytes: int = 1_000_000) -> tuple[list, list[dict]]:
    """Validate every item strictly. Returns (events, errors); errors name index, field and value.

    >>> events, errors = check_events([{"type": "step.recorded"}])
    >>> sorted({e["field"] for e in errors})[:3]
    ['event_id', 'occurred_at', 'producer']
    """
    events, errors = [], []
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") in EVENT_MODELS and item["type"] not in ACCEPTED_TYPES:
            message = f"not accepted by the gateway (accepted: {', '.join(ACCEPTED_TYPES)})"
            errors.append(_error(index, "type", item["type"], message))
            continue
        try:
            event = validate(item, strict=True)
        except DecodeError as exc:
            errors.extend(_error(index, e.field, e.value, e.message) for e in exc.errors)
            continue
        size = len(encode(event))
        if size > max_event_bytes:
            message = f"encoded event of {size} bytes exceeds the limit of {max_event_bytes} bytes per event"
            errors.append(_error(index, "$", size, message))
            continue
        events.append(event)
    return events, errors


def _error(index: int | None, field_name: str, value: Any, message: str) -> dict:
    return {"index": index, "field": field_name, "value": _preview_value(value), "message": message}


def _preview_value(value: Any, limit: int = 200) -> Any:
    """Values are echoed back as JSON, shortened when large."""
    try:
        text = orjson.dumps(value, default=str)
    except TypeError:
        return repr(value)[:limit]
    if len(text) <= limit:
        return orjson.loads(text)
    return text[:limit].decode("utf-8", "replace") + "..."


def _preview(body: bytes, pos: int, radius: int = 30) -> str:
    start = max(0, pos - radius)
    return body[start : pos + radius].decode("utf-8", "replace")


# --- publishing ------------------------------------------------------------------------------------


class AioKafkaPublisher:
    """Sends through aiokafka (acks=all, idempotence on), natively async. Measured slower than
    `KafkaPythonPublisher` on the embedded broker (`agentstream bench produce`), so not the default."""

    def __init__(self, config: GatewayConfig):
        self.config = config
        self._producer = None
        self._lock = asyncio.Lock()

    async def _started(self):
        async with self._lock:
            if self._producer is None:
                from aiokafka import AIOKafkaProducer

                producer = AIOKafkaProducer(
                    bootstrap_servers=self.config.bootstrap_servers,
                    client_id="agentstream-gateway",
                    acks="all",
                    enable_idempotence=True,
                    linger_ms=self.config.linger_ms,
                    max_request_size=16 * 1024 * 1024,
                    request_timeout_ms=int(self.config.ack_timeout_s * 1000),
                )
                try:
                    await producer.start()
                except BaseException:
                    await producer.stop()  # release its sockets; the next request tries again
                    raise
                self._producer = producer
            return self._producer

    async def send_all(self, records: list[tuple[str, bytes, bytes]]) -> list[BaseException | None]:
        producer = await self._started()
        futures = [await producer.send(topic, value=value, key=key) for topic, key, value in records]
        done, _ = (
            await asyncio.wait(futures, timeout=self.config.ack_timeout_s) if futures else (set(), set())
        )
        return [
            (f.exception() or None) if f in done else TimeoutError("no acknowledgement in time")
            for f in futures
        ]

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None


class KafkaPythonPublisher:
    """Sends through kafka-python (acks=all, idempotence on), waiting for acks in an executor thread.
    The default: 2-3x the events/s of aiokafka with lower p99 in `agentstream bench produce`."""

    def __init__(self, config: GatewayConfig):
        self.config = config
        self._producer = None
        self._lock = asyncio.Lock()

    async def _started(self):
        async with self._lock:
            if self._producer is None:
                from kafka import KafkaProducer

                ack_ms = int(self.config.ack_timeout_s * 1000)
                self._producer = await asyncio.get_running_loop().run_in_executor(
                    None,
                    lambda: KafkaProducer(
                        bootstrap_servers=self.config.bootstrap_servers,
                        client_id="agentstream-gateway",
                        acks="all",
                        linger_ms=self.config.linger_ms,
                        batch_size=256 * 1024,
                        max_request_size=16 * 1024 * 1024,
                        bootstrap_timeout_ms=3000,
                        reconnect_backoff_max_ms=1000,
                        request_timeout_ms=ack_ms,
                        delivery_timeout_ms=ack_ms + self.config.linger_ms,
                    ),
                )
            return self._producer

    async def send_all(self, records: list[tuple[str, bytes, bytes]]) -> list[BaseException | None]:
        producer = await self._started()
        futures = [producer.send(topic, key=key, value=value) for topic, key, value in records]
        timeout = self.config.ack_timeout_s

        def wait() -> list[BaseException | None]:
            deadline = time.monotonic() + timeout
            out: list[BaseException | None] = []
            for future in futures:
                try:
                    future.get(timeout=max(0.0, deadline - time.monotonic()))
                    out.append(None)
                except Exception as exc:
                    out.append(exc)
            return out

        return await asyncio.get_running_loop().run_in_executor(None, wait)

    async def close(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await asyncio.get_running_loop().run_in_executor(None, lambda: producer.close(timeout=5))


def make_publisher(config: GatewayConfig):
    return AioKafkaPublisher(config) if config.client == "aiokafka" else KafkaPythonPublisher(config)


# --- the HTTP shell --------------------------------------------------------------------------------


def create_app(config: GatewayConfig, publisher=None):
    """The aiohttp application (publisher injectable for benchmarks)."""
    from aiohttp import web

    publisher = publisher or make_publisher(config)
    app = web.Application(client_max_size=config.max_body_bytes)
    app["config"], app["publisher"] = config, publisher
    app.router.add_post("/v1/events", _post_events)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/openapi.json", _openapi)

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
            dead = await _dead_letter_items(request, items, errors, request_id)
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
            415, "unsupported media type", [_error(None, "Content-Type", request.content_type, message)]
        )
    length = request.content_length
    if length is not None and length > config.max_body_bytes:
        raise _too_large(length, config.max_body_bytes)
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(None, config.max_body_bytes) from None


def _too_large(size: int | None, limit: int) -> RequestRejected:
    got = f"{size} bytes" if size is not None else "more bytes"
    message = f"body of {got} exceeds the limit of {limit} bytes; split the events into several requests"
    return RequestRejected(413, "payload too large", [_error(None, "$", size, message)], limit_bytes=limit)


async def _publish(request, events: list, request_id: str):
    publisher = request.app["publisher"]
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


async def _dead_letter_items(request, items: list, errors: list[dict], request_id: str) -> bool:
    by_index: dict[int, list[str]] = {}
    for err in errors:
        by_index.setdefault(err["index"], []).append(f"{err['field']}: {err['message']}")
    payloads = [
        (
            f"gateway request {request_id} event #{i}: " + "; ".join(reasons),
            orjson.dumps(items[i], default=str),
        )
        for i, reasons in sorted(by_index.items())
    ]
    return await _send_dead_letters(request, payloads)


async def _dead_letter_body(request, body: bytes, reason: str, request_id: str) -> bool:
    return await _send_dead_letters(request, [(f"gateway request {request_id}: {reason}", body)])


async def _send_dead_letters(request, payloads: list[tuple[str, bytes]]) -> bool:
    """Write rejected input to the DLQ; returns whether the broker acknowledged all of it."""
    from schemas.deadletter import dead_letter

    if not request.app["config"].dead_letters:
        return False
    letters = [dead_letter(STAGE, reason, payload, error_type="DecodeError") for reason, payload in payloads]
    try:
        results = await request.app["publisher"].send_all([(DLQ, encode_key(d), encode(d)) for d in letters])
    except Exception as exc:
        log.error("gateway: cannot write %d dead letters to %s: %s", len(letters), DLQ, exc)
        return False
    return all(r is None for r in results)


async def _healthz(request):
    config: GatewayConfig = request.app["config"]
    reachable = await broker_reachable(config.bootstrap_servers)
    status = 200 if reachable else 503
    return _json(
        status, {"status": "ok" if reachable else "broker unreachable", "broker": config.bootstrap_servers}
    )


async def broker_reachable(bootstrap_servers: str, timeout_s: float = 2.0) -> bool:
    """Whether any bootstrap address answers a Kafka ApiVersions request."""
    from aiokafka.client import AIOKafkaClient

    client = AIOKafkaClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=int(timeout_s * 1000))
    try:
        await asyncio.wait_for(client.bootstrap(), timeout_s)
        return True
    except Exception:
        return False
    finally:
        await client.close()


async def _openapi(request):
    from producers.openapi import openapi_document

    return _json(200, openapi_document(request.app["config"]))


# --- running ---------------------------------------------------------------------------------------


async def serve(config: GatewayConfig, host: str, port: int, ready_file: str | None = None) -> None:
    """Run the gateway until SIGTERM/SIGINT; writes "host:port" to `ready_file` once listening."""
    from aiohttp import web

    runner = web.AppRunner(create_app(config), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0]
    address = f"{bound[0]}:{bound[1]}"
    log.info("gateway listening on http://%s (broker %s)", address, config.bootstrap_servers)
    if ready_file:
        from pathlib import Path

        Path(ready_file).write_text(address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        log.info("gateway stopping: in-flight requests finish, then the producer closes")
    finally:
        await runner.cleanup()

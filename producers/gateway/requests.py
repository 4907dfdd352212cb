"""The gateway's pure core: its configuration, the API key check, and request body -> events or
errors. No I/O here: `producers.gateway.server` is the HTTP shell around it and `producers.gateway.openapi`
describes it.
"""

from __future__ import annotations

import hashlib
import hmac
import reprlib
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from producers.errors import ProducerError, RequestRejected
from producers.http import BODY_TIMEOUT_S, HEADER_TIMEOUT_S
from producers.redaction_settings import settings_file_option
from schemas.codec import encode, validate
from schemas.errors import DecodeError
from schemas.events import EVENT_MODELS
from schemas.limits import MAX_EVENT_BYTES

STAGE = "gateway"
ACCEPTED_TYPES = ("episode.started", "step.recorded", "episode.ended", "feedback.annotation")
POLICY = "all-or-nothing: a request with any invalid event writes none of its events"


@dataclass(frozen=True)
class GatewayConfig:
    """How the gateway accepts requests and publishes them. Documented fields are `agentstream
    gateway` options. `api_key_hashes` takes sha256 hex digests (any iterable, or the command
    line's comma-separated text) and is kept as a frozenset of lowercase digests."""

    bootstrap_servers: str
    api_key_hashes: frozenset[str] | tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "comma-separated sha256 hex digests of the accepted API keys "
            "(`agentstream gateway-key KEY`)",
            "env": "AGENTSTREAM_GATEWAY_API_KEY_HASHES",
        },
    )
    allow_anonymous: bool = field(default=False, metadata={"help": "accept requests without a key"})
    max_body_bytes: int = field(default=4 * 1024 * 1024, metadata={"help": "request size limit (413 above)"})
    max_events: int = field(default=10_000, metadata={"help": "events per request limit (413 above)"})
    max_event_bytes: int = MAX_EVENT_BYTES
    otlp_cursor_path: str | None = field(
        default=None,
        metadata={"help": "file of the OTLP step cursor (default <data dir>/gateway/otlp-cursor.sqlite)"},
    )
    ack_timeout_s: float = field(
        default=30.0, metadata={"help": "wait this long for broker acks (503 after)"}
    )
    # kafka-python is the default: measured faster than aiokafka here (agentstream bench produce)
    client: Literal["kafka-python", "aiokafka"] = field(
        default="kafka-python", metadata={"help": "Kafka client: kafka-python or aiokafka"}
    )
    dead_letters: bool = True
    linger_ms: int = 2
    header_timeout_s: float = field(
        default=HEADER_TIMEOUT_S,
        metadata={"help": "close a connection that has not sent a request's headers in this time"},
    )
    body_timeout_s: float = field(
        default=BODY_TIMEOUT_S, metadata={"help": "answer 408 to a request whose body takes longer"}
    )
    settings_file: str | None = settings_file_option()

    def __post_init__(self):
        object.__setattr__(self, "api_key_hashes", parse_key_hashes(self.api_key_hashes))
        if not self.api_key_hashes and not self.allow_anonymous:
            raise ProducerError(
                "api_key_hashes: no API key hashes configured (--api-key-hashes or "
                "AGENTSTREAM_GATEWAY_API_KEY_HASHES, comma-separated sha256 hex); refusing to accept "
                "anonymous events (pass --allow-anonymous to do so on purpose)"
            )
        check_key_hashes(self.api_key_hashes)
        if self.client not in ("aiokafka", "kafka-python"):
            raise ProducerError(f"client: expected 'aiokafka' or 'kafka-python', got {self.client!r}")


# --- API keys --------------------------------------------------------------------------------------


def hash_key(key: str) -> str:
    """The sha256 hex digest to configure for an API key.

    >>> hash_key("secret")[:16]
    '2bb80d537b1da3e3'
    """
    return hashlib.sha256(key.encode()).hexdigest()


def parse_key_hashes(text: str | Iterable[str] | None) -> frozenset[str]:
    """sha256 hex digests, comma-separated or as an iterable (whitespace and case ignored).

    >>> sorted(parse_key_hashes(" AB" + "0" * 62 + ", "))
    ['ab00000000000000000000000000000000000000000000000000000000000000']
    """
    parts = (text or "").split(",") if isinstance(text, str | None) else text
    return frozenset(part.strip().lower() for part in parts if part.strip())


def check_key_hashes(hashes: frozenset[str]) -> None:
    """Raise ProducerError naming the first value that is not a sha256 hex digest."""
    for digest in hashes:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ProducerError(f"api_key_hashes: expected sha256 hex digests, got {digest[:12]!r}...")


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


# --- body -> events or errors ----------------------------------------------------------------------


def parse_body(body: bytes, max_events: int) -> list[Any]:
    """The JSON array of a request body; malformed JSON names the position of the problem."""
    try:
        items = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        message = f"malformed JSON at line {exc.lineno} column {exc.colno} (byte {exc.pos}): {exc.msg}"
        raise RequestRejected(
            400, "malformed JSON", [field_error(None, "$", _preview(body, exc.pos), message)]
        ) from None
    if not isinstance(items, list):
        raise RequestRejected(
            400,
            "not a JSON array",
            [field_error(None, "$", _preview_value(items), "expected a JSON array of events")],
        )
    if not items:
        raise RequestRejected(400, "no events", [field_error(None, "$", [], "the array is empty")])
    if len(items) > max_events:
        message = f"{len(items)} events exceed the limit of {max_events} per request"
        raise RequestRejected(413, "too many events", [field_error(None, "$", len(items), message)])
    return items


def check_events(items: list[Any], max_event_bytes: int = MAX_EVENT_BYTES) -> tuple[list, list[dict]]:
    """Validate every item strictly. Returns (events, errors); errors name index, field and value.

    >>> events, errors = check_events([{"type": "step.recorded"}])
    >>> sorted({e["field"] for e in errors})[:3]
    ['event_id', 'occurred_at', 'producer']
    """
    events, errors = [], []
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") in EVENT_MODELS and item["type"] not in ACCEPTED_TYPES:
            message = f"not accepted by the gateway (accepted: {', '.join(ACCEPTED_TYPES)})"
            errors.append(field_error(index, "type", item["type"], message))
            continue
        try:
            event = validate(item, strict=True)
        except DecodeError as exc:
            errors.extend(field_error(index, e.field, e.value, e.message) for e in exc.errors)
            continue
        size = len(encode(event))
        if size > max_event_bytes:
            message = f"encoded event of {size} bytes exceeds the limit of {max_event_bytes} bytes per event"
            errors.append(field_error(index, "$", size, message))
            continue
        events.append(event)
    return events, errors


CONTENT_ENCODINGS = ("gzip", "identity", "")


def content_encoding(headers) -> str:
    """The request's Content-Encoding, checked: 415 naming it unless identity or gzip."""
    encoding = headers.get("Content-Encoding", "").strip().lower()
    if encoding not in CONTENT_ENCODINGS:
        message = f"content encoding must be gzip or none (identity), got {encoding!r}"
        raise RequestRejected(
            415, "unsupported content encoding", [field_error(None, "Content-Encoding", encoding, message)]
        )
    return encoding


def decoded_body(body: bytes, encoding: str, limit: int) -> bytes:
    """The body with gzip undone, never more than `limit` bytes of output (a gzip bomb stops there:
    413), a broken or truncated stream a 400 that says so.

    >>> import gzip
    >>> decoded_body(gzip.compress(b"[1]"), "gzip", 10)
    b'[1]'
    """
    if encoding != "gzip":
        return body
    inflater = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise _broken_gzip(f"broken gzip stream ({exc})") from None
    if len(out) > limit:
        raise too_large(None, limit)
    if not inflater.eof:
        raise _broken_gzip("truncated gzip stream (it ends before its end marker)")
    return out


def _broken_gzip(what: str) -> RequestRejected:
    message = f"cannot read the body: {what}; send it gzip-compressed whole, or uncompressed"
    errors = [field_error(None, "Content-Encoding", "gzip", message)]
    return RequestRejected(400, "malformed gzip body", errors, message=message)


def too_large(size: int | None, limit: int) -> RequestRejected:
    """The 413 answer for a body over `limit` bytes (`size` None: the length was not announced)."""
    got = f"{size} bytes" if size is not None else "more bytes"
    message = f"body of {got} exceeds the limit of {limit} bytes; split the events into several requests"
    return RequestRejected(
        413, "payload too large", [field_error(None, "$", size, message)], limit_bytes=limit
    )


def field_error(index: int | None, field_name: str, value: Any, message: str) -> dict:
    """One entry of a 4xx answer's `errors`."""
    return {"index": index, "field": field_name, "value": _preview_value(value), "message": message}


def _preview_value(value: Any, limit: int = 200) -> Any:
    """Values are echoed back as JSON, shortened when large."""
    try:
        text = orjson.dumps(value, default=str)
    except TypeError:  # nested past what orjson writes: reprlib stops after a few levels
        return reprlib.repr(value)[:limit]
    if len(text) <= limit:
        return orjson.loads(text)
    return text[:limit].decode("utf-8", "replace") + "..."


def _preview(body: bytes, pos: int, radius: int = 30) -> str:
    start = max(0, pos - radius)
    return body[start : pos + radius].decode("utf-8", "replace")

"""Build `dead.letter` events: the reason, the stage, and the source coordinates of rejected input.

A dead letter always fits in one broker message, whatever it refuses: input over
`MAX_DEAD_LETTER_PAYLOAD_BYTES` is cut to a bounded summary (its first bytes, with the size and a
sha256 of the whole), and the reason and key are cut to their field limits. Otherwise the dead letter
of an oversized event is itself too large, and the producer that sends it fails (issue #34).
"""

from __future__ import annotations

import base64
import binascii
import hashlib

import orjson

from schemas.events import DeadLetter, utc_now
from schemas.ids import derived_event_id
from schemas.limits import MAX_DEAD_LETTER_PAYLOAD_BYTES, MAX_ID_CHARS
from schemas.records import Record


def dead_letter(
    stage: str,
    reason: str,
    payload: bytes | None,
    *,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
    key: bytes | str | None = None,
    error_type: str = "",
) -> DeadLetter:
    """A DeadLetter for `payload` rejected by `stage`. The id is deterministic in the source
    coordinates, so a stage that re-processes the same record after a restart does not add a second
    dead letter for it."""
    payload = bytes(payload or b"")
    truncated = len(payload) > MAX_DEAD_LETTER_PAYLOAD_BYTES
    text, encoding = _payload_text(payload[:MAX_DEAD_LETTER_PAYLOAD_BYTES], truncated)
    key_text = key.decode("utf-8", "replace") if isinstance(key, bytes | bytearray) else key
    coordinates = (topic, partition, offset) if offset is not None else (binascii.crc32(payload),)
    return DeadLetter(
        event_id=derived_event_id("dead.letter", stage, *coordinates),
        trajectory_id=_trajectory_id(payload) or _bounded_id(key_text) or "unknown",
        occurred_at=utc_now(),
        producer=stage,
        reason=_cut(reason, MAX_DEAD_LETTER_PAYLOAD_BYTES),
        error_type=_cut(error_type, MAX_ID_CHARS),
        stage=stage,
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        source_key=None if key_text is None else _cut(key_text, MAX_ID_CHARS),
        payload=text,
        payload_encoding=encoding,
        payload_bytes=len(payload),
        payload_sha256=hashlib.sha256(payload).hexdigest(),
        payload_truncated=truncated,
    )


def record_dead_letter(stage: str, record: Record, reason: str, error_type: str = "") -> DeadLetter:
    """`dead_letter` for a consumed `Record`, with its coordinates and key."""
    return dead_letter(
        stage,
        reason,
        record.value,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        error_type=error_type,
    )


def _payload_text(payload: bytes, truncated: bool) -> tuple[str, str]:
    """utf-8 text when it is (a prefix may end inside a character: that tail is dropped), else base64."""
    try:
        return payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError as exc:
        if truncated and exc.end == len(payload) and len(payload) - exc.start < 4:
            return _payload_text(payload[: exc.start], truncated=False)
        return base64.b64encode(payload).decode("ascii"), "base64"


def _trajectory_id(payload: bytes) -> str | None:
    if len(payload) > MAX_DEAD_LETTER_PAYLOAD_BYTES:
        return None  # not worth parsing a megabyte that is refused anyway; the key names it
    try:
        value = orjson.loads(payload).get("trajectory_id")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return _bounded_id(value)


def _bounded_id(value: object) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS else None


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 20] + f"... ({len(text)} chars)"

"""Build `dead.letter` events: the reason, the stage, and the source coordinates of rejected input."""

from __future__ import annotations

import base64
import binascii

import orjson

from schemas.events import DeadLetter, utc_now
from schemas.ids import derived_event_id
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
    text, encoding = _payload_text(payload or b"")
    key_text = key.decode("utf-8", "replace") if isinstance(key, bytes | bytearray) else key
    coordinates = (topic, partition, offset) if offset is not None else (binascii.crc32(payload or b""),)
    return DeadLetter(
        event_id=derived_event_id("dead.letter", stage, *coordinates),
        trajectory_id=_trajectory_id(payload or b"") or key_text or "unknown",
        occurred_at=utc_now(),
        producer=stage,
        reason=reason,
        error_type=error_type,
        stage=stage,
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        source_key=key_text,
        payload=text,
        payload_encoding=encoding,
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


def _payload_text(payload: bytes) -> tuple[str, str]:
    try:
        return payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(payload).decode("ascii"), "base64"


def _trajectory_id(payload: bytes) -> str | None:
    try:
        value = orjson.loads(payload).get("trajectory_id")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None

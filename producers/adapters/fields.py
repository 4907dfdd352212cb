"""Pure helpers the adapters share to read log fields: timestamps (`parse_timestamp`), chat
`content` as text (`text_of`), tool-call arguments (`json_args`), integers (`as_int`,
`non_negative`), and the short descriptions of a JSON value that error messages use (`describe`,
`shape_of`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from producers.adapters.contract import Document


def parse_timestamp(value: Any) -> tuple[datetime | None, bool]:
    """A log timestamp as an aware UTC datetime, and whether it was naive (then read as UTC).

    Accepts ISO-8601 strings (with or without zone, 'Z' allowed) and unix seconds (or milliseconds).

    >>> parse_timestamp("2025-01-27T22:44:56.900854")
    (datetime.datetime(2025, 1, 27, 22, 44, 56, 900854, tzinfo=datetime.timezone.utc), True)
    >>> parse_timestamp(1706000000.5)[0].isoformat()
    '2024-01-23T08:53:20.500000+00:00'
    """
    if isinstance(value, bool) or value is None:
        return None, False
    if isinstance(value, int | float):
        seconds = value / 1000.0 if value > 1e11 else float(value)
        try:
            return datetime.fromtimestamp(seconds, UTC), False
        except (OverflowError, OSError, ValueError):
            return None, False
    if isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None, False
        if parsed.tzinfo is None:
            return parsed.replace(tzinfo=UTC), True
        return parsed.astimezone(UTC), False
    return None, False


def text_of(content: Any) -> str:
    """Plain text of a chat `content`: a string, or a list of parts/blocks (text kept, others named).

    >>> text_of([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}, "b"])
    'a\\n[image_url]\\nb'
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part for part in (_part_text(p) for p in content) if part)
    if isinstance(content, dict):
        return _part_text(content)
    return str(content)


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return str(part)
    if isinstance(part.get("text"), str):
        return part["text"]
    if "content" in part:
        return text_of(part["content"])
    return f"[{part.get('type', 'part')}]"


def json_args(raw: Any) -> tuple[dict[str, Any], str | None]:
    """Tool-call arguments as a dict: JSON strings are decoded. Returns (params, error or None).

    >>> json_args('{"command": "ls"}')
    ({'command': 'ls'}, None)
    >>> json_args('{"command": ')[1].startswith("arguments are not valid JSON")
    True
    """
    if raw is None or raw == "":
        return {}, None
    if isinstance(raw, dict):
        return dict(raw), None
    if isinstance(raw, str):
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return {"arguments": raw}, f"arguments are not valid JSON: {exc}"
        if isinstance(value, dict):
            return value, None
        return {"arguments": value}, None
    return {"arguments": raw}, None


def as_int(value: Any) -> int | None:
    """An int from a log field (ints, integral floats, digit strings); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def non_negative(value: Any) -> int | None:
    number = as_int(value)
    return number if number is not None and number >= 0 else None


def describe(value: Any) -> str:
    """A short description of a JSON value for error messages: its type and top-level keys."""
    if isinstance(value, dict):
        keys = ", ".join(sorted(map(str, value))[:12])
        return f"an object with keys [{keys}]"
    if isinstance(value, list):
        return f"an array of {len(value)} items"
    if value is None:
        return "nothing (null or missing)"
    return f"a {type(value).__name__} ({value!r:.40})"


def shape_of(doc: Document) -> str:
    """What the file holds, for 'expected X, got Y' messages."""
    if doc.kind == "json":
        return describe(doc.value)
    return f"JSON Lines whose first record is {describe(doc.records[0])}"

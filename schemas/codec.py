"""Bytes in, events out (and back). The codec enforces the versioning policy.

- `encode(event) -> bytes`: compact JSON (pydantic's Rust serializer).
- `decode(data) -> Event`: tolerant read. Unknown fields are ignored, older schema versions accepted;
  an unknown `type` or a newer major `schema_version` is a `DecodeError` naming the field and value.
- `validate(mapping, strict=True)`: the producer-side check: unknown fields are errors too.

Both directions hold the contract's bounds (`schemas.limits`): an event over them is a `DecodeError`
naming the field, the value (abbreviated) and the limit, also when read back from a topic, so that a
consumer dead-letters a record that bypassed validation. Input nested deeper than any parser here
reads is a `DecodeError` on `$`, never a RecursionError.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import TypeAdapter, ValidationError

from schemas.bounded import UINT32_MAX
from schemas.errors import DecodeError, FieldError
from schemas.events import EVENT_MODELS, EVENT_TYPES, SCHEMA_MAJOR, Event, EventBase
from schemas.limits import MAX_EVENT_BYTES, MAX_JSON_DEPTH, json_depth

_EVENT_ADAPTER: TypeAdapter = TypeAdapter(Event)
# pydantic's JSON parser refuses input nested deeper than this (unknown fields included, which a
# tolerant read otherwise ignores); the checked path agrees, so every stage can re-encode what it read
# (orjson stops at 254). Known free-form fields are held to MAX_JSON_DEPTH by the models.
_READ_DEPTH = 200


def encode(event: EventBase) -> bytes:
    """Serialize an event to compact JSON bytes."""
    return event.__pydantic_serializer__.to_json(event)


def encode_key(event: EventBase) -> bytes:
    """The Kafka key: the trajectory id (every topic is keyed so one trajectory stays in order)."""
    return event.trajectory_id.encode()


def decode(data: bytes | bytearray | memoryview | str) -> Event:
    """Decode bytes into the event model named by its `type` (tolerant; see module docstring).

    The common case, a valid event of a version this reader knows, is validated straight from the
    bytes in pydantic's native JSON parser (about a third cheaper than parsing to a dict first: every
    hop decodes every event). Anything else takes `decode_checked`, which names what is wrong. That
    parser reads NaN / Infinity literals; the models refuse them (typed floats and `JsonDict` values),
    so such input takes the checked path and is refused as invalid JSON, as before."""
    if isinstance(data, memoryview):
        data = data.tobytes()
    check_size(len(data))
    try:
        event = _EVENT_ADAPTER.validate_json(data)
    except ValidationError:
        return decode_checked(data)
    if int(event.schema_version.split(".", 1)[0]) > SCHEMA_MAJOR:
        return decode_checked(data)
    return event


def decode_checked(data: bytes | bytearray | memoryview | str) -> Event:
    """`decode` step by step: JSON, `type`, version, then fields; raises `DecodeError` naming each
    problem. Also the reference the fast path must agree with."""
    if isinstance(data, memoryview):
        data = data.tobytes()
    check_size(len(data))
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        message = f"not valid JSON: {exc}"
        if "depth" in str(exc) or "ecursion" in str(exc):
            message += f" (events nest at most {MAX_JSON_DEPTH} levels: MAX_JSON_DEPTH)"
        raise DecodeError([FieldError("$", _preview(data), message)]) from None
    depth = json_depth(raw, limit=_READ_DEPTH)
    if depth > _READ_DEPTH:
        message = f"nests more than the limit of {_READ_DEPTH} levels (unknown fields included)"
        raise DecodeError([FieldError("$", _preview(data), message)])
    return validate(raw, strict=False)


def check_size(size: int) -> None:
    """Refuse an encoded event over `MAX_EVENT_BYTES` (it would not fit in one broker message)."""
    if size > MAX_EVENT_BYTES:
        message = f"encoded event of {size} bytes exceeds the limit of {MAX_EVENT_BYTES} bytes"
        raise DecodeError([FieldError("$", size, message)])


def validate(raw: Any, strict: bool = False) -> Event:
    """Validate a decoded JSON value as an event. `strict` also refuses unknown fields."""
    if not isinstance(raw, dict):
        raise DecodeError([FieldError("$", raw, "an event must be a JSON object")])
    event_type = _check_type(raw)
    _check_version(raw, event_type)
    model = EVENT_MODELS[event_type]
    if strict:
        _check_unknown_fields(raw, model, event_type)
        if event_type == "step.recorded":
            _check_token_ids(raw, event_type)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise DecodeError(field_errors(exc, raw), event_type) from None


def _check_type(raw: dict) -> str:
    event_type = raw.get("type")
    if event_type is None:
        raise DecodeError([FieldError("type", None, "missing: every event needs a type")])
    if event_type not in EVENT_MODELS:
        known = ", ".join(EVENT_TYPES)
        raise DecodeError([FieldError("type", event_type, f"unknown event type (known: {known})")])
    return event_type


def _check_version(raw: dict, event_type: str) -> None:
    version = raw.get("schema_version")
    if version is None:
        return  # the model default applies (current version)
    major_text = str(version).split(".", 1)[0]
    if not major_text.isdigit():
        raise DecodeError(
            [FieldError("schema_version", version, "must look like MAJOR.MINOR, e.g. '1.0'")], event_type
        )
    if int(major_text) > SCHEMA_MAJOR:
        raise DecodeError(
            [
                FieldError(
                    "schema_version",
                    version,
                    f"newer major version than this reader supports ({SCHEMA_MAJOR}.x); upgrade agentstream",
                )
            ],
            event_type,
        )


def _check_unknown_fields(raw: dict, model: type[EventBase], event_type: str) -> None:
    unknown = sorted(set(raw) - set(model.model_fields))
    if unknown:
        errors = [FieldError(name, _abbreviated(raw[name]), "unknown field") for name in unknown]
        raise DecodeError(errors, event_type)


def _check_token_ids(raw: dict, event_type: str) -> None:
    """Token ids index a vocabulary: a negative one would index an embedding table from its end, one
    past UINT32_MAX fits no vocabulary (the models check the lists' lengths and types)."""
    lists = [(name, raw.get(name)) for name in ("token_ids", "prompt_token_ids")]
    samples = raw.get("samples")
    if isinstance(samples, list):
        lists += [
            (f"samples.{i}.token_ids", s.get("token_ids"))
            for i, s in enumerate(samples)
            if isinstance(s, dict)
        ]
    errors = []
    for name, ids in lists:
        if not isinstance(ids, list) or not ids:
            continue
        try:
            low, high = min(ids), max(ids)
        except TypeError:
            low = high = None
        if not (_is_number(low) and _is_number(high)):
            # not all numbers (all strings compare too): the model names a step's own; a sample's
            # are free-form
            numbers = [i for i in ids if _is_number(i)]
            low, high = (min(numbers), max(numbers)) if numbers else (0, 0)
        bad = low if low < 0 else high if high > UINT32_MAX else None
        if bad is not None:
            message = f"token id {bad} is outside 0..{UINT32_MAX}"
            errors.append(FieldError(name, bad, message))
    if errors:
        raise DecodeError(errors, event_type)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def field_errors(exc: ValidationError, raw: Any = None) -> list[FieldError]:
    """Turn pydantic's errors into FieldErrors naming the dotted field path and the value."""
    out = []
    for err in exc.errors(include_url=False):
        path = ".".join(str(p) for p in err["loc"]) or "$"
        value = None if err["type"] == "missing" else _abbreviated(err.get("input"))
        out.append(FieldError(path, value, _message(err)))
    return out


def _abbreviated(value: Any, limit: int = 200) -> Any:
    """A value to name in an error: long strings and deep or large containers are cut, so that an
    error about a megabyte string or a value nested 1,000 levels deep stays small and safe to print,
    echo as JSON and dead-letter."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + f"... ({len(value)} characters)"
    if isinstance(value, dict | list):
        depth = json_depth(value, limit=MAX_JSON_DEPTH)
        if depth > MAX_JSON_DEPTH or len(value) > limit:
            kind = "object" if isinstance(value, dict) else "array"
            deep = f"more than {MAX_JSON_DEPTH}" if depth > MAX_JSON_DEPTH else str(depth)
            return f"<{kind} of {len(value)} items nested {deep} levels>"
    return value


def _message(err: dict) -> str:
    if err["type"] == "value_error":
        return err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        return "required field is missing"
    if err["type"] == "timezone_aware":
        return "timestamp must carry a timezone (e.g. 2026-01-01T00:00:00Z)"
    return err["msg"]


def _preview(data: Any, limit: int = 60) -> str:
    if isinstance(data, memoryview):
        data = data.tobytes()
    text = data.decode("utf-8", "replace") if isinstance(data, bytes | bytearray) else str(data)
    return text if len(text) <= limit else text[:limit] + "..."

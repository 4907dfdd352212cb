"""The event contract: codec round trips, versioning policy, clear errors, deterministic ids."""

from __future__ import annotations

import types
import typing
from datetime import UTC, datetime, timedelta, timezone

import annotated_types
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from schemas import (
    EVENT_MODELS,
    SCHEMA_VERSION,
    DecodeError,
    StepRecorded,
    decode,
    derived_event_id,
    encode,
    validate,
)
from schemas.codec import decode_checked
from schemas.topics import TOPIC_FOR_TYPE, TOPICS

JSON_SCALARS = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
JSON_FLOATS = st.floats(allow_nan=False, allow_infinity=False, width=64)
JSON_VALUES = st.recursive(
    JSON_SCALARS | JSON_FLOATS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
# hypothesis takes naive bounds and attaches the zone from `timezones`: the values drawn are aware
AWARE_DATETIMES = st.datetimes(
    min_value=datetime(2000, 1, 1),  # noqa: DTZ001
    max_value=datetime(2100, 1, 1),  # noqa: DTZ001
    timezones=st.just(UTC),
)


def strategy_for(annotation, metadata=()) -> st.SearchStrategy:
    """A hypothesis strategy for one pydantic field (covers every type our event models use)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        flat = [m for x in extra for m in (x.metadata if isinstance(x, FieldInfo) else [x])]
        return strategy_for(base, (*metadata, *flat))
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(strategy_for(arg, metadata) for arg in typing.get_args(annotation)))
    if origin is typing.Literal:
        return st.sampled_from(typing.get_args(annotation))
    if origin is list:
        (item,) = typing.get_args(annotation)
        return st.lists(strategy_for(item), max_size=4)
    if origin is dict:
        _key, value = typing.get_args(annotation)
        return st.dictionaries(st.text(max_size=10), strategy_for(value), max_size=4)
    if annotation is type(None):
        return st.none()
    if annotation is typing.Any:
        return JSON_VALUES
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        low = next((m.ge for m in metadata if isinstance(m, annotated_types.Ge)), -(2**31))
        high = next((m.le for m in metadata if isinstance(m, annotated_types.Le)), 2**31)
        return st.integers(min_value=low, max_value=high)
    if annotation is float:
        low = next((m.ge for m in metadata if isinstance(m, annotated_types.Ge)), -1e9)
        high = next((m.le for m in metadata if isinstance(m, annotated_types.Le)), 1e9)
        return st.floats(min_value=low, max_value=high, allow_nan=False)
    if annotation is str:
        min_len = next((m.min_length for m in metadata if isinstance(m, annotated_types.MinLen)), 0)
        return st.text(min_size=min_len, max_size=30)
    if annotation is datetime or "AwareDatetime" in repr(metadata) or "Aware" in repr(annotation):
        return AWARE_DATETIMES
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model_strategy(annotation)
    raise NotImplementedError(f"no strategy for {annotation!r}")


def model_strategy(model: type[BaseModel]) -> st.SearchStrategy:
    fields = {}
    for name, info in model.model_fields.items():
        if name == "type":
            continue
        if name == "schema_version":
            fields[name] = st.sampled_from(["1.0", "1.3", "0.9"])
            continue
        fields[name] = strategy_for(info.annotation, tuple(info.metadata))
    return st.fixed_dictionaries(fields).map(lambda kw: model(**kw))


@pytest.mark.parametrize("event_type", sorted(EVENT_MODELS))
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data())
def test_every_event_model_round_trips_through_the_codec(event_type, data):
    event = data.draw(model_strategy(EVENT_MODELS[event_type]))
    decoded = decode(encode(event))
    assert type(decoded) is type(event)
    assert decoded == event


@pytest.mark.parametrize("event_type", sorted(EVENT_MODELS))
@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data())
def test_fast_decode_agrees_with_the_checked_path(event_type, data):
    """`decode` validates straight from the bytes; `decode_checked` parses to a dict first."""
    raw = encode(data.draw(model_strategy(EVENT_MODELS[event_type])))
    assert decode(raw) == decode_checked(raw)
    assert decode(raw.decode()) == decode(memoryview(raw)) == decode_checked(raw)


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_finite_literals_are_not_json_even_in_free_form_fields(literal):
    """pydantic's own JSON parser would read them into `metadata`; the codec refuses them as before."""
    raw = orjson.dumps(_step(params={"x": 1})).replace(b'{"x":1}', b'{"x":' + literal + b"}")
    with pytest.raises(DecodeError) as info:
        decode(raw)
    assert "not valid JSON" in str(info.value)


def _step(**overrides) -> dict:
    base = {
        "event_id": "e1",
        "type": "step.recorded",
        "schema_version": SCHEMA_VERSION,
        "trajectory_id": "t1",
        "occurred_at": "2026-11-21T10:00:00Z",
        "producer": "test",
        "step_index": 3,
        "tool": "bash",
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not ...}


def _decode_error(raw) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        decode(orjson.dumps(raw))
    return info.value


def test_missing_required_field_names_the_field():
    err = _decode_error(_step(trajectory_id=...))
    assert err.errors[0].field == "trajectory_id"
    assert "trajectory_id" in str(err) and "missing" in str(err)


def test_wrong_type_names_field_and_value():
    err = _decode_error(_step(exit_code="not-a-number"))
    assert err.errors[0].field == "exit_code"
    assert err.errors[0].value == "not-a-number"
    assert "'not-a-number'" in str(err)


def test_negative_step_index_is_refused_with_its_value():
    err = _decode_error(_step(step_index=-1))
    assert err.errors[0].field == "step_index"
    assert "-1" in str(err)


def test_naive_timestamp_is_refused():
    err = _decode_error(_step(occurred_at="2026-11-21T10:00:00"))
    assert err.errors[0].field == "occurred_at"
    assert "timezone" in str(err) and "2026-11-21T10:00:00" in str(err)


def test_unknown_type_names_the_type():
    err = _decode_error(_step(type="step.teleported"))
    assert err.errors[0].field == "type"
    assert "step.teleported" in str(err) and "step.recorded" in str(err)


def test_newer_major_version_is_refused():
    err = _decode_error(_step(schema_version="2.0"))
    assert err.errors[0].field == "schema_version"
    assert "'2.0'" in str(err)


def test_older_version_with_missing_optional_fields_decodes():
    raw = {k: v for k, v in _step(schema_version="0.9").items() if k not in ("tool",)}
    event = decode(orjson.dumps(raw))
    assert isinstance(event, StepRecorded)
    assert event.schema_version == "0.9" and event.tool == "" and event.observation == ""


def test_unknown_fields_are_ignored_when_reading_but_refused_when_producing():
    raw = _step(brand_new_field={"x": 1})
    assert decode(orjson.dumps(raw)).step_index == 3
    with pytest.raises(DecodeError) as info:
        validate(raw, strict=True)
    assert info.value.errors[0].field == "brand_new_field"


def test_timestamps_are_normalised_to_utc():
    event = decode(orjson.dumps(_step(occurred_at="2026-11-21T12:00:00+02:00")))
    assert event.occurred_at == datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
    assert event.occurred_at.utcoffset() == timedelta(0)
    assert event.occurred_at == datetime(2026, 11, 21, 12, 0, tzinfo=timezone(timedelta(hours=2)))


def test_not_json_is_a_decode_error():
    with pytest.raises(DecodeError) as info:
        decode(b"\x00\xffnot json")
    assert "not valid JSON" in str(info.value)


def test_derived_ids_are_deterministic():
    a = derived_event_id("reward.rule.step", "src-1", "rules-1")
    assert a == derived_event_id("reward.rule.step", "src-1", "rules-1")
    assert a != derived_event_id("reward.rule.step", "src-2", "rules-1")
    assert a != derived_event_id("reward.judge.step", "src-1", "rules-1")


@given(st.text())
def test_derived_ids_are_exactly_uuid5_of_the_namespace(name):
    """The fast path gives the very ids `uuid.uuid5` gave (replays of old logs keep their ids)."""
    import uuid

    from schemas.ids import NAMESPACE, uuid5_text

    assert uuid5_text(name) == str(uuid.uuid5(NAMESPACE, name))


def test_every_event_type_has_exactly_one_topic():
    assert set(TOPIC_FOR_TYPE) == set(EVENT_MODELS)
    for spec in TOPICS.values():
        assert spec.partitions >= 1
        assert "cleanup.policy" in spec.config

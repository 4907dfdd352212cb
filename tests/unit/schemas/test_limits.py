"""The contract's bounds (issue #34), as a consumer meets them: a record over a bound written straight
onto a topic fails `decode` with a `DecodeError` naming the field, the value and the limit (so the
consumer dead-letters it), at any nesting depth and never as a RecursionError; and the dead letter of
any input fits in one broker message."""

from __future__ import annotations

import orjson
import pytest

from schemas.bounded import INT64_MAX, INT64_MIN, UINT32_MAX
from schemas.codec import decode, decode_checked, encode, validate
from schemas.deadletter import dead_letter
from schemas.errors import DecodeError
from schemas.limits import (
    MAX_DEAD_LETTER_PAYLOAD_BYTES,
    MAX_EVENT_BYTES,
    MAX_ID_CHARS,
    MAX_JSON_DEPTH,
    MAX_STEP_INDEX,
    MAX_STEPS,
    MAX_TOKENS_PER_LIST,
)

BROKER_MAX_MESSAGE_BYTES = 1_048_588
ENVELOPE = {"event_id": "e1", "trajectory_id": "t", "occurred_at": "2026-01-01T00:00:00Z", "producer": "p"}


def step(**fields) -> bytes:
    return orjson.dumps({**ENVELOPE, "type": "step.recorded", "step_index": 0, **fields})


def nested_params(depth: int) -> bytes:
    """A step whose params nest `depth` arrays deep inside the params object (written as text)."""
    return step(params={"x": "NESTED"}).replace(b'"NESTED"', b"[" * depth + b"1" + b"]" * depth)


def refused(data: bytes) -> DecodeError:
    for read in (decode, decode_checked):
        with pytest.raises(DecodeError) as caught:
            read(data)
    return caught.value


@pytest.mark.parametrize(
    ("data", "field", "limit"),
    [
        (step(step_index=2**32), "step_index", MAX_STEP_INDEX),
        (step(step_index=MAX_STEP_INDEX + 1), "step_index", MAX_STEP_INDEX),
        (orjson.dumps({**ENVELOPE, "type": "episode.ended", "success": True, "total_steps": 10**8}),
         "total_steps", MAX_STEPS),
        (orjson.dumps({**ENVELOPE, "type": "episode.started", "task_id": "t", "reference_steps": 10**8}),
         "reference_steps", MAX_STEPS),
        (step(tool="t" * (MAX_ID_CHARS + 1)), "tool", MAX_ID_CHARS),
        (step(token_ids=[1] * (MAX_TOKENS_PER_LIST + 1)), "token_ids", MAX_TOKENS_PER_LIST),
        # the store's columns: ClickHouse stored 2**40 tokens as 0 and an exit code of 2**63 as -2**63
        (step(input_tokens=2**32), "input_tokens", UINT32_MAX),
        (step(output_tokens=2**40), "output_tokens", UINT32_MAX),
        (step(redactions=2**32), "redactions", UINT32_MAX),
        (step(exit_code=2**63), "exit_code", INT64_MAX),
        (orjson.dumps({**ENVELOPE, "type": "episode.ended", "success": True, "input_tokens": 2**32}),
         "input_tokens", UINT32_MAX),
    ],
)  # fmt: skip
def test_a_value_over_its_bound_fails_decode_naming_field_value_and_limit(data, field, limit):
    error = refused(data)
    [problem] = error.errors
    assert problem.field == field and str(limit) in problem.message
    assert len(str(error)) < 600  # the value is abbreviated


def test_the_bounds_themselves_decode():
    assert decode(step(step_index=MAX_STEP_INDEX)).step_index == MAX_STEP_INDEX
    edge = decode(step(input_tokens=UINT32_MAX, exit_code=INT64_MIN, token_ids=[0, UINT32_MAX]))
    assert (edge.input_tokens, edge.exit_code, edge.token_ids) == (UINT32_MAX, INT64_MIN, [0, UINT32_MAX])
    assert decode(nested_params(MAX_JSON_DEPTH - 3)).params  # event 1 + params 1 + 62 arrays = 64


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH - 1, 200, 254, 255, 300, 1000, 1020, 5000, 100_000])
def test_nesting_over_the_bound_is_a_decode_error_at_any_depth(depth):
    error = refused(nested_params(depth))
    [problem] = error.errors
    assert problem.field in ("params", "$")
    assert str(MAX_JSON_DEPTH) in problem.message or "depth" in problem.message or "nests" in problem.message
    assert len(str(error)) < 600


def test_an_unknown_field_nested_past_what_the_parsers_read_is_refused_too():
    data = step(junk="NESTED").replace(b'"NESTED"', b"[" * 600 + b"]" * 600)
    assert refused(data).errors[0].field == "$"


def test_an_encoded_event_over_the_size_bound_fails_decode():
    data = step(observation="x" * 500_000, thought="y" * 500_000)
    assert len(data) > MAX_EVENT_BYTES
    [problem] = refused(data).errors
    assert problem.field == "$" and str(MAX_EVENT_BYTES) in problem.message


@pytest.mark.parametrize(
    "payload",
    [b"x" * 5_000_000, "é".encode() * 2_000_000, bytes(range(256)) * 10_000, b"[" * 2_000_000],
)
def test_any_dead_letter_fits_in_one_broker_message_and_keeps_size_and_hash(payload):
    letter = dead_letter("gateway", "r" * 2_000_000, payload, key="k" * 10_000, error_type="E" * 1000)
    encoded = encode(letter)
    assert len(encoded) < BROKER_MAX_MESSAGE_BYTES // 2
    assert decode(encoded) == letter
    assert letter.payload_truncated and letter.payload_bytes == len(payload)
    assert len(letter.payload_sha256) == 64
    prefix = letter.payload.encode() if letter.payload_encoding == "utf-8" else b""
    assert len(prefix) <= MAX_DEAD_LETTER_PAYLOAD_BYTES and payload.startswith(prefix)


def test_a_small_dead_letter_keeps_its_whole_payload():
    payload = b'{"trajectory_id": "t1"}'
    letter = dead_letter("sink", "bad", payload, topic="agent.events", partition=0, offset=7)
    assert letter.payload == '{"trajectory_id": "t1"}' and not letter.payload_truncated
    assert letter.trajectory_id == "t1" and letter.payload_bytes == 23


@pytest.mark.parametrize(
    ("fields", "field", "bad"),
    [
        ({"token_ids": [5, -1, 7]}, "token_ids", -1),
        ({"prompt_token_ids": [1, 2**32]}, "prompt_token_ids", 2**32),
        ({"samples": [{"token_ids": [1]}, {"token_ids": [2**40]}]}, "samples.1.token_ids", 2**40),
    ],
)
def test_a_token_id_outside_a_vocabulary_is_refused_where_events_enter(fields, field, bad):
    """Checked by the producer-side validation (gateway, ingest), not on every decode (per element it
    would cost a long step 40% more at every hop)."""
    with pytest.raises(DecodeError) as caught:
        validate(orjson.loads(step(**fields)), strict=True)
    [problem] = caught.value.errors
    assert (problem.field, problem.value) == (field, bad) and str(UINT32_MAX) in problem.message


@pytest.mark.parametrize(
    "fields",
    [
        {"token_ids": ["a", "b"]},
        {"prompt_token_ids": ["x", -1]},
        {"samples": [{"token_ids": ["free", "form"]}]},
    ],
)
def test_token_ids_that_are_not_numbers_are_a_decode_error_not_a_crash(fields):
    """Found by the schemathesis run: a list of strings made the range check compare str with int,
    a TypeError the gateway answered with a plain 500."""
    try:
        validate(orjson.loads(step(**fields)), strict=True)
    except DecodeError:
        pass  # the model names a step's own ids; a sample's are free-form and may pass

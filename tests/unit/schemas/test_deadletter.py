"""Dead letters keep the rejected bytes, the reason and where they came from."""

from __future__ import annotations

import base64

from schemas import DeadLetter, decode, encode
from schemas.deadletter import dead_letter


def test_dead_letter_carries_reason_and_source_coordinates():
    payload = b'{"type": "step.recorded", "trajectory_id": "t-9", "step_index": -1}'
    letter = dead_letter(
        "rules",
        "step_index: must be >= 0 (got -1)",
        payload,
        topic="agent.events",
        partition=2,
        offset=41,
        key=b"t-9",
        error_type="DecodeError",
    )
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == ("agent.events", 2, 41)
    assert letter.trajectory_id == "t-9" and letter.stage == "rules"
    assert letter.payload == payload.decode() and letter.payload_encoding == "utf-8"
    assert isinstance(decode(encode(letter)), DeadLetter)


def test_binary_payload_is_kept_as_base64_and_id_is_stable():
    payload = b"\x00\xff\xfe garbage"
    first = dead_letter("sink", "not valid JSON", payload, topic="agent.events", partition=0, offset=7)
    again = dead_letter("sink", "not valid JSON", payload, topic="agent.events", partition=0, offset=7)
    assert first.payload_encoding == "base64"
    assert base64.b64decode(first.payload) == payload
    assert first.trajectory_id == "unknown"
    assert first.event_id == again.event_id


def test_a_records_dead_letter_names_its_coordinates_and_key():
    from schemas.deadletter import record_dead_letter
    from schemas.records import Record

    record = Record("agent.events", 2, 41, b"t-1", b"{not json")
    letter = record_dead_letter("rules", record, "not valid JSON", "DecodeError")
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == ("agent.events", 2, 41)
    assert (letter.source_key, letter.trajectory_id, letter.error_type) == ("t-1", "t-1", "DecodeError")
    assert letter == record_dead_letter("rules", record, "not valid JSON", "DecodeError").model_copy(
        update={"occurred_at": letter.occurred_at}
    )

"""The durable spool: framing, torn-tail recovery, corruption, segments, cursor, slot locking."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producers.errors import SpoolError
from producers.sdk.spool import MAGIC, Spool, SpoolRecord, encode_frame, has_pending, slot_status
from producers.sdk.spool_cursor import Cursor, DeliveryIntent


def records(n: int, start: int = 0, size: int = 10) -> list[SpoolRecord]:
    return [
        SpoolRecord("agent.events", f"t{i % 3}".encode(), f"e{i}", b"v" * size + str(i).encode())
        for i in range(start, start + n)
    ]


def test_append_read_round_trip_and_persistence(tmp_path):
    spool = Spool(tmp_path / "s")
    assert spool.append(records(5)) == 5
    got = spool.read(0, 100)
    assert [r.event_id for r in got] == [f"e{i}" for i in range(5)]
    assert [r.seq for r in got] == list(range(5))
    assert got[2].key == b"t2" and got[2].value.endswith(b"2")
    spool.close()
    reopened = Spool(tmp_path / "s")
    assert reopened.end_seq == 5 and reopened.pending == 5
    assert [r.event_id for r in reopened.read(3, 100)] == ["e3", "e4"]
    reopened.close()


def test_torn_tail_is_truncated_and_appends_continue(tmp_path):
    spool = Spool(tmp_path / "s")
    spool.append(records(3))
    spool.close()
    segment = next((tmp_path / "s").glob("*.seg"))
    half_frame = encode_frame(records(1, start=3)[0])[:11]
    with open(segment, "ab") as handle:
        handle.write(half_frame)  # a crash in the middle of a write
    spool = Spool(tmp_path / "s")
    assert spool.end_seq == 3
    spool.append(records(2, start=3))
    assert [r.event_id for r in spool.read(0, 100)] == ["e0", "e1", "e2", "e3", "e4"]
    spool.close()


def test_corruption_before_the_tail_names_file_and_offset(tmp_path):
    spool = Spool(tmp_path / "s")
    spool.append(records(3))
    segment = next((tmp_path / "s").glob("*.seg"))
    data = bytearray(segment.read_bytes())
    data[len(MAGIC) + 12] ^= 0xFF  # flip a byte of the first record's body
    segment.write_bytes(bytes(data))
    with pytest.raises(SpoolError, match=r"corrupt frame at byte 8 \(seq 0\)"):
        spool.read(0, 10)
    spool.close()


def test_segments_rotate_and_delivered_ones_are_deleted(tmp_path):
    spool = Spool(tmp_path / "s", segment_bytes=300)
    for i in range(10):
        spool.append(records(2, start=2 * i, size=100))
    assert len(list((tmp_path / "s").glob("*.seg"))) > 3
    assert [r.seq for r in spool.read(0, 100)] == list(range(20))
    assert [r.event_id for r in spool.read(7, 3)] == ["e7", "e8", "e9"]
    spool.commit(Cursor(delivered=15))
    remaining = sorted(p.name for p in (tmp_path / "s").glob("*.seg"))
    assert int(remaining[0].split(".")[0]) <= 15  # the segment holding seq 15 is kept
    assert [r.seq for r in spool.read(15, 100)] == list(range(15, 20))
    spool.close()
    reopened = Spool(tmp_path / "s", segment_bytes=300)
    assert reopened.pending == 5 and reopened.end_seq == 20
    reopened.close()


def test_cursor_with_intent_survives_reopen(tmp_path):
    spool = Spool(tmp_path / "s")
    spool.append(records(4))
    spool.commit(Cursor(1, DeliveryIntent(1, 3, {"agent.events": {0: 7, 3: 2}})))
    spool.close()
    reopened = Spool(tmp_path / "s")
    assert reopened.cursor.delivered == 1
    assert reopened.cursor.intent == DeliveryIntent(1, 3, {"agent.events": {0: 7, 3: 2}})
    reopened.close()


def test_a_slot_has_one_owner_and_open_slot_prefers_undelivered_ones(tmp_path):
    root = tmp_path / "spool"
    first = Spool.open_slot(root)
    with pytest.raises(SpoolError, match="in use by another process"):
        Spool(first.directory)
    second = Spool.open_slot(root)
    assert first.directory != second.directory
    second.append(records(2))
    second.close()
    first.close()
    assert has_pending(root / "1") and not has_pending(root / "0")
    chosen = Spool.open_slot(root)
    assert chosen.directory == root / "1"
    assert [row["pending"] for row in slot_status(root) if row["slot"] == "0"] == [0]
    chosen.close()


_record = st.builds(
    SpoolRecord,
    topic=st.sampled_from(["agent.events", "feedback.human"]),
    key=st.binary(max_size=40),
    event_id=st.text(min_size=1, max_size=40),
    value=st.binary(max_size=300),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(st.lists(_record, min_size=1, max_size=8), min_size=1, max_size=6),
    cut=st.integers(0, 400),
)
def test_any_records_round_trip_and_any_torn_tail_leaves_a_prefix(tmp_path_factory, batches, cut):
    directory = tmp_path_factory.mktemp("prop")
    spool = Spool(directory, segment_bytes=700)
    for batch in batches:
        spool.append(batch)
    flat = [r for batch in batches for r in batch]
    got = spool.read(0, 10_000, 1 << 40)
    assert [(r.topic, r.key, r.event_id, r.value) for r in got] == [
        (r.topic, r.key, r.event_id, r.value) for r in flat
    ]
    spool.close()
    tail = max(directory.glob("*.seg"))
    data = tail.read_bytes()
    tail.write_bytes(data[: max(len(MAGIC), len(data) - cut)])  # a crash cut the newest segment short
    reopened = Spool(directory, segment_bytes=700)
    survivors = reopened.read(0, 10_000, 1 << 40)
    assert [r.event_id for r in survivors] == [r.event_id for r in flat[: len(survivors)]]
    assert reopened.end_seq == len(survivors)
    reopened.close()

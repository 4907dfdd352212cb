"""The spool's delivery cursor (producers/sdk/spool_cursor.py): two slots overwritten in turn, one file
for the spool's life, a torn write falls back to the previous cursor, and a `cursor.json` left by an
earlier version is read once and replaced."""

from __future__ import annotations

import orjson
import pytest

from producers.errors import SpoolError
from producers.sdk.spool import Spool, SpoolRecord, has_pending
from producers.sdk.spool_cursor import (
    CURSOR_FILE,
    LEGACY_CURSOR_FILE,
    SLOT_BYTES,
    Cursor,
    CursorFile,
    DeliveryIntent,
    decode_slot,
    encode_slot,
)


def _records(n: int) -> list[SpoolRecord]:
    return [SpoolRecord("agent.events", b"t1", f"e{i}", b"{}") for i in range(n)]


def test_commits_overwrite_one_file_in_turn_and_the_newest_is_read(tmp_path):
    cursors = CursorFile(tmp_path)
    cursors.commit(Cursor(3, DeliveryIntent(3, 5, {"agent.events": {0: 9}})))
    inode = (tmp_path / CURSOR_FILE).stat().st_ino
    cursors.commit(Cursor(6))
    cursors.commit(Cursor(6, DeliveryIntent(6, 8, {"agent.events": {0: 12, 1: 4}})))
    cursors.close()
    assert (tmp_path / CURSOR_FILE).stat().st_ino == inode  # never replaced: no inode churn
    assert (tmp_path / CURSOR_FILE).stat().st_size == 2 * SLOT_BYTES
    again = CursorFile(tmp_path)
    assert again.load() == Cursor(6, DeliveryIntent(6, 8, {"agent.events": {0: 12, 1: 4}}))
    assert again.generation == 3


def test_a_torn_write_leaves_the_previous_cursor(tmp_path):
    cursors = CursorFile(tmp_path)
    cursors.commit(Cursor(4))  # generation 1: slot 1
    cursors.commit(Cursor(9, DeliveryIntent(9, 12)))  # generation 2: slot 0
    cursors.close()
    data = bytearray((tmp_path / CURSOR_FILE).read_bytes())
    data[20] ^= 0xFF  # inside slot 0's payload: its checksum no longer matches
    (tmp_path / CURSOR_FILE).write_bytes(bytes(data))
    assert CursorFile(tmp_path).load() == Cursor(4)
    cut = bytes(data[:SLOT_BYTES]) + b"\0" * SLOT_BYTES  # and with slot 1 zeroed: nothing valid
    (tmp_path / CURSOR_FILE).write_bytes(cut)
    assert CursorFile(tmp_path).load() == Cursor()


def test_a_legacy_cursor_json_is_read_then_replaced_by_the_first_commit(tmp_path):
    spool = Spool(tmp_path / "s")
    spool.append(_records(5))
    spool.close()
    legacy = {"delivered": 2, "intent": {"first": 2, "last": 4, "offsets": {"agent.events": {"0": 7}}}}
    (tmp_path / "s" / LEGACY_CURSOR_FILE).write_bytes(orjson.dumps(legacy))
    (tmp_path / "s" / CURSOR_FILE).unlink(missing_ok=True)
    assert has_pending(tmp_path / "s")
    reopened = Spool(tmp_path / "s")
    assert reopened.cursor == Cursor(2, DeliveryIntent(2, 4, {"agent.events": {0: 7}}))
    reopened.commit(Cursor(5))
    assert not (tmp_path / "s" / LEGACY_CURSOR_FILE).exists()
    reopened.close()
    assert not has_pending(tmp_path / "s")
    last = Spool(tmp_path / "s")
    assert last.cursor == Cursor(5) and last.pending == 0
    last.close()


def test_a_cursor_too_large_for_its_slot_is_refused_by_name():
    offsets = {f"topic-{t}": {p: 10**12 for p in range(1024)} for t in range(16)}
    with pytest.raises(SpoolError, match="does not fit a 262144-byte slot"):
        encode_slot(1, Cursor(0, DeliveryIntent(0, 1, offsets)))
    assert decode_slot(encode_slot(7, Cursor(3))) == (7, Cursor(3))
    assert decode_slot(b"\0" * 64) is None and decode_slot(b"") is None

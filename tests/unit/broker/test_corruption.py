"""The broker's storage detects corruption (issue 34, item 11): at load, also after a clean shutdown,
and on read; what it cuts is reported at ERROR with its offsets and kept aside under `corrupt/`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from infra.broker.errors import StoredBatchCorruptError
from infra.broker.log import PartitionLog
from infra.broker.log_config import LogConfig
from infra.broker.records import iter_batches
from infra.broker.store import BrokerStore
from tests.support.storage_batches import crash, make_batch, read_all

CONFIG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=256)
RECORDS = 4  # per batch


def fill(plog: PartitionLog, batches: int) -> list[tuple[int, bytes]]:
    expected = []
    for b in range(batches):
        values = [b"b%d-r%d-" % (b, r) + b"v" * 60 for r in range(RECORDS)]
        result = plog.append(make_batch(values))
        expected.extend(zip(range(result.base_offset, result.last_offset + 1), values, strict=True))
    return expected


def batch_positions(segment: Path) -> list[tuple[int, int]]:
    """(byte position, size) of every batch in a segment file."""
    out, pos = [], 0
    for header, _ in iter_batches(segment.read_bytes()):
        out.append((pos, header.size))
        pos += header.size
    return out


def flip(segment: Path, byte: int) -> None:
    with open(segment, "r+b") as fh:
        fh.seek(byte)
        old = fh.read(1)
        fh.seek(byte)
        fh.write(bytes([old[0] ^ 0x40]))


def errors_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_bad_crc_at_the_tail_is_detected_after_a_clean_shutdown(tmp_path, caplog):
    directory = tmp_path / "t-0"
    plog = PartitionLog(directory, CONFIG)
    expected = fill(plog, 20)
    plog.close()
    segment = directory / f"{0:020d}.log"
    pos, size = batch_positions(segment)[-1]
    cut = segment.read_bytes()[pos:]
    flip(segment, pos + size - 5)  # inside the last batch's records: only its CRC tells
    with caplog.at_level(logging.ERROR):
        reopened = PartitionLog(directory, CONFIG)
    assert read_all(reopened) == expected[:-RECORDS], "the corrupt batch is never served"
    assert reopened.high_watermark == 76
    [message] = errors_of(caplog)
    assert "t-0" in message and "from offset 76" in message and "crc mismatch" in message
    kept = directory / "corrupt" / f"{0:020d}-76.bin"
    assert kept.exists() and str(kept) in message
    assert kept.read_bytes()[:10] == cut[:10] and len(kept.read_bytes()) == size
    assert reopened.append(make_batch([b"after"])).base_offset == 76


def test_bad_byte_mid_segment_after_a_crash_keeps_every_batch_after_it(tmp_path, caplog):
    directory = tmp_path / "t-0"
    plog = PartitionLog(directory, CONFIG)
    expected = fill(plog, 60)
    crash(plog)
    segment = directory / f"{0:020d}.log"
    pos, size = batch_positions(segment)[10]  # offsets 40..43
    damaged = bytearray(segment.read_bytes()[pos : pos + size])
    flip(segment, pos + size // 2)
    damaged[size // 2] ^= 0x40
    with caplog.at_level(logging.ERROR):
        reopened = PartitionLog(directory, CONFIG)
    survivors = [r for r in expected if not 40 <= r[0] <= 43]
    assert read_all(reopened) == survivors, "the 196 records after the damage are still served"
    assert reopened.high_watermark == 240
    [message] = errors_of(caplog)
    assert "offsets 40..43 are corrupt" in message and "t-0" in message
    kept = directory / "corrupt" / f"{0:020d}-40.bin"
    assert kept.read_bytes() == bytes(damaged) and str(kept) in message
    assert reopened.read(40, 1 << 20)[:8] == (44).to_bytes(8, "big"), "reads skip the gap"
    again = (reopened.close(), PartitionLog(directory, CONFIG))[1]
    assert read_all(again) == survivors


def test_a_damaged_batch_length_is_resynchronised_by_searching(tmp_path, caplog):
    directory = tmp_path / "t-0"
    plog = PartitionLog(directory, CONFIG)
    expected = fill(plog, 30)
    plog.close()
    segment = directory / f"{0:020d}.log"
    pos, _ = batch_positions(segment)[5]  # offsets 20..23
    flip(segment, pos + 9)  # batchLength: the file no longer says where the next batch starts
    with caplog.at_level(logging.ERROR):
        reopened = PartitionLog(directory, CONFIG)
    assert read_all(reopened) == [r for r in expected if not 20 <= r[0] <= 23]
    assert any("offsets 20..23 are corrupt" in m for m in errors_of(caplog))


def test_corruption_in_a_sealed_segment_is_found_at_load(tmp_path, caplog):
    directory = tmp_path / "t-0"
    config = LogConfig(segment_bytes=2048, index_interval_bytes=256)
    plog = PartitionLog(directory, config)
    expected = fill(plog, 40)
    assert plog.segment_count > 3
    plog.close()
    first = sorted(directory.glob("*.log"))[0]
    pos, size = batch_positions(first)[2]
    flip(first, pos + size - 3)
    with caplog.at_level(logging.ERROR):
        reopened = PartitionLog(directory, config)
    assert read_all(reopened) == [r for r in expected if not 8 <= r[0] <= 11]
    assert any("offsets 8..11 are corrupt" in m for m in errors_of(caplog))


def test_torn_tail_after_a_crash_is_a_warning_and_still_kept(tmp_path, caplog):
    directory = tmp_path / "t-0"
    plog = PartitionLog(directory, CONFIG)
    expected = fill(plog, 10)
    crash(plog)
    segment = directory / f"{0:020d}.log"
    torn = make_batch([b"torn" * 40])[:70]
    with open(segment, "ab") as fh:
        fh.write(torn)
    with caplog.at_level(logging.WARNING):
        reopened = PartitionLog(directory, CONFIG)
    assert read_all(reopened) == expected
    assert not errors_of(caplog)
    assert any("torn last batch from offset 40" in r.getMessage() for r in caplog.records)
    assert (directory / "corrupt" / f"{0:020d}-40.bin").read_bytes() == torn


def test_a_batch_damaged_while_running_is_refused_not_served(tmp_path, caplog):
    directory = tmp_path / "t-0"
    plog = PartitionLog(directory, CONFIG)
    expected = fill(plog, 20)
    plog.flush()
    segment = directory / f"{0:020d}.log"
    pos, size = batch_positions(segment)[8]  # offsets 32..35
    flip(segment, pos + size - 7)  # the disk returns other bytes than were written
    data = plog.read(0, 1 << 20)
    served = [h.base_offset for h, _ in iter_batches(data)]  # iter_batches verifies every CRC
    assert served == list(range(0, 32, RECORDS)), "the batches before the damage, not it"
    with caplog.at_level(logging.DEBUG, logger="infra.broker.log"):
        for _ in range(3):
            with pytest.raises(StoredBatchCorruptError, match="base offset 32"):
                plog.read(32, 1 << 20)
            with pytest.raises(StoredBatchCorruptError):
                plog.read(34, 1)
    [message] = errors_of(caplog)  # once, however often a consumer retries
    assert "t-0" in message and "offset 32" in message
    assert [r for r in read_all(plog, start=36)] == expected[36:]


def test_a_damaged_index_file_is_reported_and_rebuilt(tmp_path, caplog):
    directory = tmp_path / "t-0"
    config = LogConfig(segment_bytes=2048, index_interval_bytes=128)
    plog = PartitionLog(directory, config)
    expected = fill(plog, 30)
    plog.close()
    index = sorted(directory.glob("*.index"))[0]
    index.write_bytes(index.read_bytes()[:-3])
    with caplog.at_level(logging.WARNING):
        reopened = PartitionLog(directory, config)
    assert read_all(reopened) == expected
    assert any("damaged: rebuilt" in r.getMessage() for r in caplog.records)
    assert len(index.read_bytes()) % 16 == 0


def test_damaged_offsets_and_producer_id_files_are_reported_not_fatal(tmp_path, caplog):
    store = BrokerStore(tmp_path)
    store.create_topic("t", 1)
    store.commit_offsets("g1", {("t", 0): (5, None, 0)})
    store.commit_offsets("g2", {("t", 0): (7, None, 0)})
    first_pid = store.next_producer_id()
    store.close()
    lines = (tmp_path / "group_offsets.jsonl").read_bytes().split(b"\n")
    lines[0] = lines[0][:5] + b"\xff" + lines[0][6:]
    (tmp_path / "group_offsets.jsonl").write_bytes(b"\n".join(lines))
    (tmp_path / "producer_ids.json").write_bytes(b'{"next_blo\x00')
    with caplog.at_level(logging.ERROR):
        reopened = BrokerStore(tmp_path)
    assert reopened.committed("g2") == {("t", 0): (7, None, 0)}
    assert reopened.next_producer_id() > first_pid + 1000
    messages = errors_of(caplog)
    assert any("group_offsets.jsonl" in m and "line 1 unreadable" in m for m in messages)
    assert any("producer_ids.json" in m for m in messages)
    assert len(list((tmp_path / "corrupt").glob("group_offsets.jsonl.*"))) == 1
    reopened.close()


def test_damaged_group_membership_file_means_a_rebalance_not_a_crash(tmp_path, caplog):
    from infra.broker.state import BrokerConfig, BrokerState

    store = BrokerStore(tmp_path)
    (tmp_path / "groups.json").write_text(json.dumps({"g": {"members": [{"member_id": 1}]}}))
    try:
        with caplog.at_level(logging.ERROR):
            state = BrokerState(BrokerConfig(data_dir=tmp_path), store)
        assert state.groups.groups == {}
        assert any("groups.json" in m and "rebalance" in m for m in errors_of(caplog))
    finally:
        store.close()

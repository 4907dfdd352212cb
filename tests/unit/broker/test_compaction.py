"""Log compaction of one PartitionLog: latest value per key, tombstones, offsets, crash safety."""

from __future__ import annotations

import time

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from infra.broker import compaction
from infra.broker.compaction import compact_log, split_records
from infra.broker.errors import InvalidConfigError
from infra.broker.log import PartitionLog
from infra.broker.log_config import LogConfig
from infra.broker.records import iter_batches
from tests.support.storage_batches import crash

COMPACT = LogConfig(segment_bytes=4096, index_interval_bytes=256, compact=True, retention_ms=-1)
NOW = int(time.time() * 1000)


def keyed_batch(pairs, *, ts: int = NOW, compression: int = 0, producer=(-1, -1, -1)) -> bytes:
    """One v2 batch of (key, value) records; value None is a tombstone."""
    builder = DefaultRecordBatchBuilder(2, compression, False, *producer, 1 << 30)
    for i, (key, value) in enumerate(pairs):
        builder.append(i, ts, key, value, [])
    return bytes(builder.build())


def records_of(plog) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record from the log start, following gaps like a client."""
    out, offset = [], plog.log_start_offset
    while offset < plog.high_watermark:
        data = plog.read(offset, 1 << 20)
        if not data:
            break
        for header, view in iter_batches(data):  # also checks every CRC
            out.extend((r.offset, r.key, r.value) for r in DefaultRecordBatch(bytes(view)))
            offset = header.last_offset + 1
    return out


def updates(plog, rounds: int, keys: int, *, ts: int = NOW, compression: int = 0) -> dict:
    """`rounds` batches updating every key once; returns {key: (offset, value)} of the latest."""
    latest = {}
    for r in range(rounds):
        pairs = [(b"key-%02d" % k, b"round-%03d-" % r + b"x" * 40) for k in range(keys)]
        result = plog.append(keyed_batch(pairs, ts=ts, compression=compression))
        for i, (key, value) in enumerate(pairs):
            latest[key] = (result.base_offset + i, value)
    return latest


def roll(plog, key: bytes = b"roll") -> int:
    """Append a record too big to share a segment, so everything before it is sealed."""
    return plog.append(keyed_batch([(key, b"r" * (plog.config.segment_bytes - 200))])).base_offset


def test_keeps_the_latest_value_per_key_with_offsets_unchanged(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", COMPACT)
    latest = updates(plog, 60, 10)
    marker = roll(plog)
    before_segments, hw = plog.segment_count, plog.high_watermark
    stats = compact_log(plog, NOW)
    assert stats is not None and stats.records_before == 600 and stats.records_after == 10
    assert stats.bytes_after < stats.bytes_before / 20
    got = records_of(plog)
    assert got[:-1] == sorted((o, k, v) for k, (o, v) in latest.items())
    assert got[-1][0] == marker and plog.high_watermark == hw and plog.log_start_offset == 0
    assert plog.segment_count < before_segments, "small cleaned segments are merged"
    assert compact_log(plog, NOW) is None, "nothing new to clean"


def test_reads_from_a_removed_offset_serve_the_next_existing_one(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", COMPACT)
    latest = updates(plog, 60, 10)
    roll(plog)
    compact_log(plog, NOW)
    first_kept = min(o for o, _ in latest.values())
    data = plog.read(3, 1 << 20)  # offset 3 was superseded long ago
    first = next(iter(DefaultRecordBatch(bytes(next(iter_batches(data))[1]))))
    assert first.offset == first_kept > 3


def test_tombstone_stays_until_delete_retention_then_goes_with_its_key(tmp_path):
    cfg = LogConfig(**{**COMPACT.__dict__, "delete_retention_ms": 60_000})
    plog = PartitionLog(tmp_path / "t-0", cfg)
    updates(plog, 20, 5, ts=NOW)
    plog.append(keyed_batch([(b"key-01", None)], ts=NOW))
    roll(plog)
    compact_log(plog, NOW + 1000)
    keys = {k: v for _, k, v in records_of(plog)}
    assert b"key-01" in keys and keys[b"key-01"] is None, "the tombstone is visible before it expires"
    assert compact_log(plog, NOW + 59_000) is None, "not due yet: nothing to do"
    assert compact_log(plog, NOW + 60_001) is not None, "a due tombstone triggers a cleaning"
    keys = {k: v for _, k, v in records_of(plog)}
    assert b"key-01" not in keys and len(keys) == 5, "tombstone and every older value of key-01 are gone"


def test_min_compaction_lag_keeps_recent_segments_uncleaned(tmp_path):
    cfg = LogConfig(**{**COMPACT.__dict__, "min_compaction_lag_ms": 10_000})
    plog = PartitionLog(tmp_path / "t-0", cfg)
    updates(plog, 30, 10, ts=NOW - 60_000)
    updates(plog, 30, 10, ts=NOW)
    roll(plog)
    compact_log(plog, NOW)
    offsets = [o for o, _, _ in records_of(plog)]
    assert set(range(300, 600)) <= set(offsets), "records younger than the lag are all still there"
    assert 10 <= len([o for o in offsets if o < 300]) < 60, "the old segments were compacted"


def test_delete_policy_log_is_never_compacted(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", LogConfig(segment_bytes=4096, index_interval_bytes=256))
    updates(plog, 60, 10)
    roll(plog)
    files = {p.name: p.stat().st_size for p in (tmp_path / "t-0").iterdir()}
    assert compact_log(plog, NOW) is None
    assert {p.name: p.stat().st_size for p in (tmp_path / "t-0").iterdir()} == files
    assert len(records_of(plog)) == 601


@pytest.mark.parametrize("compression", [1, 3], ids=["gzip", "lz4"])
def test_compressed_batches_are_rewritten_with_their_codec(tmp_path, compression):
    plog = PartitionLog(tmp_path / "t-0", COMPACT)
    latest = updates(plog, 40, 10, compression=compression)
    roll(plog)
    compact_log(plog, NOW)
    data = plog.read(0, 1 << 20)
    assert all(h.attributes & 0x07 == compression for h, _ in iter_batches(data))
    assert {k: v for _, k, v in records_of(plog)[:-1]} == {k: v for k, (_, v) in latest.items()}


def test_idempotent_producer_state_survives_compaction_and_restart(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", COMPACT)
    seq = 0
    for r in range(30):
        pairs = [(b"key-%d" % k, b"v%d-" % r + b"y" * 60) for k in range(5)]
        plog.append(keyed_batch(pairs, producer=(7, 0, seq)))
        seq += 5
    roll(plog)
    compact_log(plog, NOW)
    for path in (tmp_path / "t-0").glob("*.snapshot"):
        path.unlink()  # force the state to be rebuilt from the compacted log itself
    crash(plog)
    reopened = PartitionLog(tmp_path / "t-0", COMPACT)
    retry = reopened.append(keyed_batch([(b"key-0", b"again")] * 5, producer=(7, 0, seq - 5)))
    assert retry.duplicate, "the producer's last batch is still known after compaction"
    nxt = reopened.append(keyed_batch([(b"key-0", b"next")], producer=(7, 0, seq)))
    assert not nxt.duplicate and nxt.base_offset == reopened.high_watermark - 1


def test_reopen_after_compaction_reads_the_same_clean_or_not(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", COMPACT)
    updates(plog, 60, 10)
    roll(plog)
    compact_log(plog, NOW)
    expected = records_of(plog)
    plog.close()
    clean = PartitionLog(tmp_path / "t-0", COMPACT)
    assert records_of(clean) == expected
    crash(clean)
    for path in (tmp_path / "t-0").glob("*.index"):
        path.unlink()
    assert records_of(PartitionLog(tmp_path / "t-0", COMPACT)) == expected


def test_crash_before_the_commit_point_keeps_the_old_segments(tmp_path, monkeypatch):
    plog = PartitionLog(tmp_path / "t-0", COMPACT)
    updates(plog, 60, 10)
    roll(plog)
    before = records_of(plog)

    def killed(*args):
        raise SystemExit("kill -9 while the cleaned file is written")

    monkeypatch.setattr(compaction.os, "replace", killed)
    with pytest.raises(SystemExit):
        compact_log(plog, NOW)
    monkeypatch.undo()
    (tmp_path / "t-0" / f"{0:020d}.cleaned").write_bytes(b"half a cleaned segment")
    crash(plog)
    reopened = PartitionLog(tmp_path / "t-0", COMPACT)
    assert records_of(reopened) == before
    assert not list((tmp_path / "t-0").glob("*.cleaned"))


@pytest.mark.parametrize("deleted_before_crash", [0, 2])
def test_crash_after_the_commit_point_finishes_the_swap_on_open(tmp_path, monkeypatch, deleted_before_crash):
    plog = PartitionLog(tmp_path / "t-0", COMPACT)
    latest = updates(plog, 60, 10)
    roll(plog)
    real_unlink, calls = type(tmp_path).unlink, []

    def unlink_then_die(path, missing_ok=False):
        if path.suffix == ".log":
            calls.append(path)
            if len(calls) > deleted_before_crash:
                raise SystemExit("kill -9 half way through the swap")
        real_unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(type(tmp_path), "unlink", unlink_then_die)
    with pytest.raises(SystemExit):
        compact_log(plog, NOW)
    monkeypatch.undo()
    assert list((tmp_path / "t-0").glob("*.swap")), "the crash left a committed swap"
    crash(plog)
    reopened = PartitionLog(tmp_path / "t-0", COMPACT)
    got = records_of(reopened)
    assert {k: (o, v) for o, k, v in got[:-1]} == latest
    assert not list((tmp_path / "t-0").glob("*.swap"))


def test_compact_and_delete_policy_does_both(tmp_path):
    cfg = LogConfig.from_topic_config(
        {"cleanup.policy": "compact,delete", "retention.ms": "1000", "segment.bytes": "4096"}
    )
    assert cfg.compact and cfg.retention_ms == 1000
    plog = PartitionLog(tmp_path / "t-0", cfg)
    updates(plog, 30, 10, ts=NOW - 60_000)
    roll(plog)
    assert compact_log(plog, NOW) is not None
    assert plog.apply_retention(NOW) >= 1 and plog.log_start_offset > 0


def test_topic_config_keys_and_their_errors():
    cfg = LogConfig.from_topic_config(
        {
            "cleanup.policy": "compact",
            "delete.retention.ms": "5",
            "min.compaction.lag.ms": "7",
            "min.cleanable.dirty.ratio": "0.1",
        }
    )
    assert (cfg.compact, cfg.delete_retention_ms, cfg.min_compaction_lag_ms) == (True, 5, 7)
    assert cfg.min_cleanable_dirty_ratio == 0.1
    assert not LogConfig.from_topic_config({}).compact
    with pytest.raises(InvalidConfigError, match=r"min.cleanable.dirty.ratio.*'lots'"):
        LogConfig.from_topic_config({"min.cleanable.dirty.ratio": "lots"})
    with pytest.raises(InvalidConfigError, match=r"delete.retention.ms.*-1"):
        LogConfig.from_topic_config({"delete.retention.ms": "-1"})


def test_split_records_returns_exact_bytes_keys_and_tombstones():
    batch = keyed_batch([(b"a", b"1"), (None, b"2"), (b"c", None)])
    section = batch[61:]
    records = split_records(section, 3)
    assert [r[4] for r in records] == [b"a", None, b"c"]
    assert [r[5] for r in records] == [False, False, True]
    assert [r[2] for r in records] == [0, 1, 2]
    assert b"".join(section[s:e] for s, e, *_ in records) == section


def test_a_producers_superseded_last_batch_stays_empty_and_keeps_its_sequence(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", COMPACT)
    plog.append(keyed_batch([(b"a", b"old-a"), (b"b", b"old-b")], producer=(9, 0, 0)))
    plog.append(keyed_batch([(b"a", b"new-a"), (b"b", b"new-b")]))  # another client overwrites both
    roll(plog)
    compact_log(plog, NOW)
    first = next(iter_batches(plog.read(0, 1 << 20)))[0]
    assert (first.base_offset, first.last_offset, first.record_count) == (0, 1, 0)
    assert [k for _, k, _ in records_of(plog)] == [b"a", b"b", b"roll"]
    for path in (tmp_path / "t-0").glob("*.snapshot"):
        path.unlink()
    crash(plog)
    reopened = PartitionLog(tmp_path / "t-0", COMPACT)
    assert reopened.append(keyed_batch([(b"a", b"x"), (b"b", b"y")], producer=(9, 0, 0))).duplicate
    assert not reopened.append(keyed_batch([(b"c", b"z")], producer=(9, 0, 2))).duplicate

"""The write-ahead file (infra/broker/wal.py): one fsync per round, and what it restores after an
operating-system crash took the partition logs' unsynced tails (simulated by cutting the segment
files back to what was fsynced)."""

from __future__ import annotations

import os
import uuid

from infra.broker import wal as wal_module
from infra.broker.log_config import LogConfig
from infra.broker.store import WAL_DIR, BrokerStore
from infra.broker.wal import WriteAhead, encode_frame, read_frames
from tests.support.storage_batches import crash_store, make_batch, read_all

NEVER = LogConfig(flush="interval", flush_interval_ms=2**62)  # what `--flush always` gives the logs


def _store(path) -> BrokerStore:
    store = BrokerStore(path, NEVER)
    store.open_write_ahead()
    return store


def _produce(store: BrokerStore, topic: str, partition: int, records: bytes) -> int:
    """What the Produce handler does: append to the log (no fsync), then frame it."""
    partition_log = store.log(topic, partition)
    result = partition_log.append(records)
    store.write_ahead.append(
        partition_log, store.topic(topic).topic_id, partition, result.base_offset, records
    )
    return result.base_offset


def _lose_unsynced_tail(store: BrokerStore, synced: dict) -> None:
    """kill the machine: every active segment goes back to the size it had when last fsynced."""
    crash_store(store)
    for (topic, partition), size in synced.items():
        segment = store.data_dir / f"{topic}-{partition}" / f"{0:020d}.log"
        os.truncate(segment, size)


def _sizes(store: BrokerStore, *keys) -> dict:
    return {key: store.log(*key)._segments[-1].size for key in keys}


def test_frames_read_back_and_a_torn_last_frame_is_dropped(tmp_path):
    topic = uuid.uuid4()
    path = tmp_path / "0.wal"
    whole = encode_frame(topic, 1, 7, b"records") + encode_frame(topic, 2, 9, b"more")
    path.write_bytes(whole + encode_frame(topic, 3, 11, b"torn")[:-2])
    frames = [(t, p, base, bytes(r)) for t, p, base, r in read_frames(path)]
    assert frames == [(topic, 1, 7, b"records"), (topic, 2, 9, b"more")]


def test_records_acknowledged_through_the_write_ahead_file_survive_losing_the_logs_tails(tmp_path):
    store = _store(tmp_path)
    store.create_topic("t", 2, {})
    _produce(store, "t", 0, make_batch([b"a0", b"a1"]))
    store.flush_all()  # these two are in the log before the crash
    synced = _sizes(store, ("t", 0), ("t", 1))
    _produce(store, "t", 0, make_batch([b"a2"]) + make_batch([b"a3", b"a4"]))
    _produce(store, "t", 1, make_batch([b"b0"]))
    store.write_ahead.flush()  # the round's only fsync: the produces above are acknowledged now
    _lose_unsynced_tail(store, synced)

    store = _store(tmp_path)
    assert read_all(store.log("t", 0)) == [(0, b"a0"), (1, b"a1"), (2, b"a2"), (3, b"a3"), (4, b"a4")]
    assert read_all(store.log("t", 1)) == [(0, b"b0")]
    assert list((tmp_path / WAL_DIR).iterdir()) == [], "replayed, fsynced, and started over"
    _produce(store, "t", 1, make_batch([b"b1"]))  # appends carry on after the restored ones
    assert read_all(store.log("t", 1)) == [(0, b"b0"), (1, b"b1")]


def test_a_frame_half_in_the_log_restores_only_the_batches_the_log_lost(tmp_path):
    store = _store(tmp_path)
    store.create_topic("t", 1, {})
    first, second = make_batch([b"x0", b"x1"]), make_batch([b"x2"])
    _produce(store, "t", 0, first + second)
    store.write_ahead.flush()
    _lose_unsynced_tail(store, {("t", 0): len(first) + 8})  # the first batch and a torn piece survive
    store = _store(tmp_path)
    assert read_all(store.log("t", 0)) == [(0, b"x0"), (1, b"x1"), (2, b"x2")]


def test_a_kill_9_leaves_the_logs_whole_and_replay_adds_nothing(tmp_path):
    store = _store(tmp_path)
    store.create_topic("t", 1, {})
    _produce(store, "t", 0, make_batch([b"only"]))
    store.write_ahead.flush()
    crash_store(store)  # the process died, the page cache did not
    assert BrokerStore(tmp_path, NEVER).open_write_ahead() == 0


def test_a_topic_deleted_and_created_again_gets_none_of_its_predecessors_records(tmp_path):
    store = _store(tmp_path)
    store.create_topic("t", 1, {})
    _produce(store, "t", 0, make_batch([b"old"]))
    store.write_ahead.flush()
    store.delete_topic("t")
    store.create_topic("t", 1, {})
    crash_store(store)
    store = _store(tmp_path)
    assert read_all(store.log("t", 0)) == []


def test_a_checkpoint_fsyncs_the_logs_and_deletes_the_files_before_it(tmp_path, monkeypatch):
    store = _store(tmp_path)
    store.create_topic("t", 1, {})
    wal: WriteAhead = store.write_ahead
    _produce(store, "t", 0, make_batch([b"a"]))
    wal.flush()
    before = sorted(p.name for p in (tmp_path / WAL_DIR).iterdir())
    assert len(before) == 1 and store.log("t", 0)._dirty
    monkeypatch.setattr(wal_module, "CHECKPOINT_S", 0.0)  # due now: the next round checkpoints first
    _produce(store, "t", 0, make_batch([b"b"]))
    wal.flush()
    assert not store.log("t", 0)._dirty, "the checkpoint fsynced the log"
    after = sorted(p.name for p in (tmp_path / WAL_DIR).iterdir())
    assert len(after) == 1 and after[0] > before[0], "the old file is gone, new frames go to a new one"
    monkeypatch.setattr(wal_module, "CHECKPOINT_S", 3600.0)
    _produce(store, "t", 0, make_batch([b"c"]))
    assert sorted(p.name for p in (tmp_path / WAL_DIR).iterdir()) == after
    store.close()
    assert list((tmp_path / WAL_DIR).iterdir()) == [], "a clean close leaves nothing to replay"

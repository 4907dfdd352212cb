"""BrokerStore: topics, durable group offsets and producer ids across restarts (clean and crashed)."""

from __future__ import annotations

import pytest

from infra.broker.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from infra.broker.log_config import LogConfig
from infra.broker.store import TOPIC_DEFAULTS, BrokerStore
from tests.support.storage_batches import crash_store, make_batch, read_all


def reopen(store: BrokerStore, clean: bool) -> BrokerStore:
    store.close() if clean else crash_store(store)
    return BrokerStore(store.data_dir, store.default_config)


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "crash"])
def test_topics_data_offsets_and_producer_ids_survive_restart(tmp_path, clean):
    store = BrokerStore(tmp_path, LogConfig())
    meta = store.create_topic("agent.events", 3, {"retention.ms": "-1"})
    store.log("agent.events", 1).append(make_batch([b"hello", b"world"]))
    store.commit_offsets("g1", {("agent.events", 0): (5, None, -1), ("agent.events", 1): (2, "meta", 0)})
    store.commit_offsets("g1", {("agent.events", 0): (9, "later", 0)})
    store.commit_offsets("g2", {("agent.events", 2): (1, None, -1)})
    pids = [store.next_producer_id() for _ in range(3)]
    store = reopen(store, clean)
    assert store.topic("agent.events") == meta
    assert store.topic_by_id(meta.topic_id) == meta
    assert read_all(store.log("agent.events", 1)) == [(0, b"hello"), (1, b"world")]
    assert store.committed("g1") == {
        ("agent.events", 0): (9, "later", 0),
        ("agent.events", 1): (2, "meta", 0),
    }
    assert store.groups_with_offsets() == ["g1", "g2"]
    assert store.next_producer_id() not in pids and store.next_producer_id() > max(pids)


def test_create_topic_validation(tmp_path):
    store = BrokerStore(tmp_path, LogConfig())
    store.create_topic("ok.name_1-x", 1, {})
    with pytest.raises(TopicExistsError, match=r"ok\.name_1-x"):
        store.create_topic("ok.name_1-x", 1, {})
    for bad in ["", ".", "..", "a/b", "white space", "x" * 250, "naïve", "trailing\n"]:
        with pytest.raises(InvalidTopicError):
            store.create_topic(bad, 1, {})
    with pytest.raises(InvalidPartitionsError, match="got 0"):
        store.create_topic("zero", 0, {})
    with pytest.raises(InvalidConfigError, match=r"segment\.bytes"):
        store.create_topic("badcfg", 1, {"segment.bytes": "big"})
    assert sorted(store.topics()) == ["ok.name_1-x"]


def test_unknown_topic_and_partition(tmp_path):
    store = BrokerStore(tmp_path, LogConfig())
    store.create_topic("t", 2, {})
    with pytest.raises(UnknownTopicError, match="'nope'"):
        store.log("nope", 0)
    with pytest.raises(UnknownPartitionError, match="partition: 2"):
        store.log("t", 2)
    with pytest.raises(UnknownTopicError):
        store.delete_topic("nope")


def test_delete_topic_removes_data_and_offsets_and_recreate_starts_empty(tmp_path):
    store = BrokerStore(tmp_path, LogConfig())
    old = store.create_topic("t", 2, {})
    store.log("t", 0).append(make_batch([b"old"]))
    store.commit_offsets("g", {("t", 0): (1, None, -1), ("other", 0): (4, None, -1)})
    store.delete_topic("t")
    assert store.topic("t") is None and not (tmp_path / "t-0").exists()
    assert store.committed("g") == {("other", 0): (4, None, -1)}
    new = store.create_topic("t", 1, {})
    assert new.topic_id != old.topic_id and store.log("t", 0).high_watermark == 0
    store = reopen(store, clean=False)
    assert store.committed("g") == {("other", 0): (4, None, -1)}
    assert store.topic("t").partitions == 1


def test_stale_partition_directory_does_not_resurrect_data(tmp_path):
    store = BrokerStore(tmp_path, LogConfig())
    store.create_topic("t", 1, {})
    store.log("t", 0).append(make_batch([b"old"]))
    store.close()
    (tmp_path / "topics.json").write_text('{"topics": {}}')  # as if a delete crashed after saving topics
    store = BrokerStore(tmp_path, LogConfig())
    store.create_topic("t", 1, {})
    assert store.log("t", 0).high_watermark == 0


def test_group_offsets_deletion_and_torn_last_line(tmp_path):
    store = BrokerStore(tmp_path, LogConfig())
    store.commit_offsets("keep", {("t", 0): (3, None, -1)})
    store.commit_offsets("drop", {("t", 0): (7, None, -1)})
    store.delete_group_offsets("drop")
    assert store.groups_with_offsets() == ["keep"]
    crash_store(store)
    with open(tmp_path / "group_offsets.jsonl", "ab") as fh:
        fh.write(b'{"g":"keep","c":[["t",0,99')  # a commit torn by a crash was never acknowledged
    store = BrokerStore(tmp_path, LogConfig())
    assert store.committed("keep") == {("t", 0): (3, None, -1)}
    assert store.committed("drop") == {}
    store.commit_offsets("keep", {("t", 0): (4, None, -1)})
    assert reopen(store, clean=False).committed("keep") == {("t", 0): (4, None, -1)}


def test_offsets_file_is_compacted_on_open(tmp_path):
    store = BrokerStore(tmp_path, LogConfig())
    for i in range(200):
        store.commit_offsets("g", {("t", 0): (i, None, -1)})
    store = reopen(store, clean=True)
    assert len((tmp_path / "group_offsets.jsonl").read_bytes().splitlines()) == 1
    assert store.committed("g") == {("t", 0): (199, None, -1)}


def test_topic_configs_merge_defaults_and_drive_the_log(tmp_path):
    store = BrokerStore(tmp_path, LogConfig(flush="interval"))
    store.create_topic("small", 1, {"segment.bytes": "1024", "cleanup.policy": "compact"})
    configs = store.topic_configs("small")
    assert configs["segment.bytes"] == "1024" and configs["cleanup.policy"] == "compact"
    assert configs["retention.ms"] == TOPIC_DEFAULTS["retention.ms"] == "604800000"
    assert set(TOPIC_DEFAULTS) <= set(configs)
    plog = store.log("small", 0)
    for _ in range(10):
        plog.append(make_batch([b"x" * 300]))
    assert plog.segment_count > 3
    assert store.log_config(store.topic("small")).flush == "interval"


def test_store_retention_moves_log_start(tmp_path):
    store = BrokerStore(tmp_path, LogConfig())
    store.create_topic("r", 1, {"segment.bytes": "1024", "retention.ms": "1000"})
    plog = store.log("r", 0)
    for i in range(12):
        plog.append(make_batch([b"y" * 300], timestamp_ms=1_000 if i < 6 else 10_000))
    assert store.apply_retention(now_ms=10_000) > 0
    assert plog.log_start_offset > 0
    store = reopen(store, clean=True)
    assert store.log("r", 0).log_start_offset == plog.log_start_offset


def test_compacted_topics_are_never_trimmed_by_retention(tmp_path):
    store = BrokerStore(tmp_path, LogConfig(retention_ms=1))
    store.create_topic("app-table-changelog", 1, {"cleanup.policy": "compact", "segment.bytes": "1024"})
    plog = store.log("app-table-changelog", 0)
    for _ in range(12):
        plog.append(make_batch([b"state" * 60], timestamp_ms=1_000))
    assert store.apply_retention(now_ms=10**13) == 0
    assert plog.log_start_offset == 0 and len(read_all(plog)) == 12


def test_a_damaged_topics_file_is_a_clear_error(tmp_path):
    from infra.broker.errors import BrokerStorageError

    (tmp_path / "topics.json").write_text('{"topics": {"t": {"partitions": 1}}}')
    with pytest.raises(BrokerStorageError, match=r"topics\.json: not a valid topics file"):
        BrokerStore(tmp_path, LogConfig())


def test_create_topic_ignores_null_config_values(tmp_path):
    store = BrokerStore(tmp_path, LogConfig())
    meta = store.create_topic("t", 1, {"retention.ms": None, "segment.bytes": 2048})
    assert meta.configs == {"segment.bytes": "2048"}


def test_a_second_store_on_the_same_directory_is_refused(tmp_path):
    from infra.broker.errors import BrokerStorageError

    store = BrokerStore(tmp_path, LogConfig())
    with pytest.raises(BrokerStorageError, match=r"in use by another broker \(pid \d+\)"):
        BrokerStore(tmp_path, LogConfig())
    store.close()
    BrokerStore(tmp_path, LogConfig()).close()


def test_offsets_committed_without_sync_wait_for_flush_offsets(tmp_path, monkeypatch):
    """OffsetCommit under `--flush always` writes its line at once and leaves the fsync to the group
    commit's next round, which calls `offsets_journal.flush()`."""
    import os

    syncs: list[str] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    monkeypatch.setattr(os, "fsync", lambda fd: syncs.append("fsync") or real_fsync(fd))
    monkeypatch.setattr(os, "fdatasync", lambda fd: syncs.append("fdatasync") or real_fdatasync(fd))
    store = BrokerStore(tmp_path, LogConfig())
    syncs.clear()
    store.commit_offsets("g", {("t", 0): (3, None, -1)}, sync=False)
    store.commit_offsets("g", {("t", 1): (8, "m", 0)}, sync=False)
    assert syncs == []
    assert store.committed("g") == {("t", 0): (3, None, -1), ("t", 1): (8, "m", 0)}  # visible at once
    store.offsets_journal.flush()
    store.offsets_journal.flush()  # nothing new: no second fsync
    assert syncs == ["fdatasync"]
    store.commit_offsets("g", {("t", 0): (4, None, -1)})  # the default still fsyncs before returning
    assert syncs == ["fdatasync", "fsync"]
    assert reopen(store, clean=False).committed("g") == {("t", 0): (4, None, -1), ("t", 1): (8, "m", 0)}

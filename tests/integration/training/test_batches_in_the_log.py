"""Integration: batches without a shared disk (since 1.5), on the embedded broker.

- a trainer consumer builds SFT batches; a second, fresh trainer with another data dir replays
  `trajectory.scored` from offset 0 and rebuilds the same batches (ids and `rows_sha256`); both
  batch dirs are deleted; an executor with a third data dir trains every batch from the log alone,
  once, and dead-letters with their coordinates a batch whose chunk was tampered with and one whose
  chunk is missing;
- kill -9 of the executor while a batch is being assembled (its chunks read, its batch.built not yet
  there) loses nothing: its commit was held at the first chunk, and the restarted executor trains it;
- a flood of fake batch ids between a batch's chunks and its batch.built sets the batch aside (past
  the executor's bound of open batches): its chunks are read again from the log and it trains once.
"""

from __future__ import annotations

import shutil

import pytest

from consumers.batching.batch_writer import BatchStore
from consumers.batching.row_chunks import chunk_events
from schemas import topics
from schemas.codec import decode, encode
from schemas.events import BatchBuilt, BatchRows, PolicyUpdated
from tests.support.processes import AGENTSTREAM, Proc, wait_for
from tests.support.trainer_data import synthetic

pytestmark = pytest.mark.integration


def _read_all(bootstrap, topic):
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=1500)
    parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    records = [(r.offset, decode(r.value)) for r in consumer]
    consumer.close()
    return records


def _send(bootstrap, events) -> list:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    sent = [producer.send(topics.TRAINING_BATCHES if isinstance(e, BatchBuilt | BatchRows) else
                          topics.TRAJECTORY_SCORED, key=e.trajectory_id.encode(), value=encode(e)).get(30)
            for e in events]  # fmt: skip
    producer.close()
    return sent


def _build(broker, data_dir, group: str) -> list:
    """`agentstream batch` (SFT, 4 trajectories a batch) until idle; its manifests."""
    args = [*AGENTSTREAM, "batch", "--bootstrap-servers", broker.bootstrap, "--data-dir", str(data_dir),
            "--kinds", "sft", "--batch-trajectories", "4", "--flush-interval-s", "0.3", "--group-size", "4",
            "--idle-exit-s", "2", "--group-id", group, "--log-level", "INFO"]  # fmt: skip
    proc = Proc(args, data_dir.parent / f"{group}.log")
    assert proc.popen.wait(timeout=120) == 0, proc.log_text()[-3000:]
    proc.stop()
    return sorted(BatchStore(data_dir).manifests("sft"), key=lambda m: m.batch_id)


def _executor(broker, data_dir, log_name: str, idle_exit_s: float = 4) -> Proc:
    args = [*AGENTSTREAM, "train", "--follow", "--idle-exit-s", str(idle_exit_s), "--bootstrap-servers",
            broker.bootstrap, "--data-dir", str(data_dir), "--base-model", "tiny", "--kinds", "sft",
            "--log-level", "INFO"]  # fmt: skip
    return Proc(args, data_dir.parent / log_name)


def _updates(bootstrap) -> list[PolicyUpdated]:
    return [e for _, e in _read_all(bootstrap, topics.POLICY_UPDATES)]


def test_an_executor_on_another_data_dir_trains_the_batches_from_the_log_alone(broker, tmp_path):
    from clients.kafka import ensure_topics

    ensure_topics(broker.bootstrap)
    _send(broker.bootstrap, synthetic(16, group_size=4))
    first = _build(broker, tmp_path / "trainer-a", "trainer-a")
    replayed = _build(broker, tmp_path / "trainer-b", "trainer-b")  # a fresh group: from offset 0
    assert len(first) >= 2
    assert [(m.batch_id, m.rows_sha256, m.chunks) for m in first] == [
        (m.batch_id, m.rows_sha256, m.chunks) for m in replayed
    ], "a replay from offset 0 rebuilds identical batches"
    assert all(m.rows_sha256 == m.sha256 and m.chunks >= 1 for m in first)
    # two bad batches of the same rows: one chunk's rows changed (its checksum kept), one chunk lost
    good = first[0]
    *chunks, built = good.events()
    tampered_id, missing_id = "sft-tampered", "sft-missing"
    tampered = [c.model_copy(update={"batch_id": tampered_id, "trajectory_id": tampered_id}) for c in chunks]
    tampered[0] = tampered[0].model_copy(update={"rows": [*tampered[0].rows[:-1], {"messages": []}]})
    lost = chunk_events(missing_id, "sft", [{"messages": []}] * 3, built.occurred_at, "tests", chunk_bytes=20)
    bad = [
        *tampered,
        built.model_copy(update={"event_id": "b-t", "batch_id": tampered_id, "trajectory_id": tampered_id}),
        *lost[1:],
        built.model_copy(
            update={"event_id": "b-m", "batch_id": missing_id, "trajectory_id": missing_id, "row_count": 3,
                    "chunks": len(lost), "rows_sha256": lost[0].rows_sha256}
        ),
    ]  # fmt: skip
    sent = _send(broker.bootstrap, bad)
    for directory in ("trainer-a", "trainer-b"):
        shutil.rmtree(tmp_path / directory / "batches")  # no batch file anywhere
    executor = _executor(broker, tmp_path / "executor", "executor.log")
    assert executor.popen.wait(timeout=300) == 0, executor.log_text()[-3000:]
    executor.stop()
    updates = _updates(broker.bootstrap)
    assert [u.policy_version for u in updates] == [f"v{n}" for n in range(1, len(first) + 1)]
    assert sorted(b for u in updates for b in u.batch_ids) == [m.batch_id for m in first], "each batch once"
    letters = [e for _, e in _read_all(broker.bootstrap, topics.DLQ) if e.stage == "executor"]
    coordinates = {(d.source_topic, d.source_offset): d for d in letters}
    tampered_at, missing_at = sent[len(tampered)].offset, sent[-1].offset
    assert set(coordinates) == {(topics.TRAINING_BATCHES, tampered_at), (topics.TRAINING_BATCHES, missing_at)}
    assert coordinates[(topics.TRAINING_BATCHES, tampered_at)].error_type == "ChecksumMismatch"
    assert coordinates[(topics.TRAINING_BATCHES, missing_at)].error_type == "MissingChunks"
    assert "missing [0]" in coordinates[(topics.TRAINING_BATCHES, missing_at)].reason


def test_kill9_mid_assembly_loses_nothing(broker, tmp_path):
    from kafka import KafkaConsumer, TopicPartition

    from clients.kafka import ensure_topics

    ensure_topics(broker.bootstrap)
    _send(broker.bootstrap, synthetic(8, group_size=4))
    built_first = _build(broker, tmp_path / "trainer", "trainer")
    *chunks, built = built_first[0].events()
    shutil.rmtree(tmp_path / "trainer" / "batches")
    # a batch cut off mid-publish: its chunks are in the log, its batch.built not yet
    later = "sft-later"
    tail = _send(
        broker.bootstrap, [c.model_copy(update={"batch_id": later, "trajectory_id": later}) for c in chunks]
    )
    data_dir, part = tmp_path / "executor", TopicPartition(topics.TRAINING_BATCHES, 0)
    watcher = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="agentstream-executor")
    executor = _executor(broker, data_dir, "executor-1.log", idle_exit_s=120)
    try:
        wait_for(
            lambda: f"assembling batch {later}" in executor.log_text(), timeout_s=300, what="the assembly"
        )
        wait_for(
            lambda: len(_updates(broker.bootstrap)) == len(built_first), timeout_s=60, what="the batches"
        )
        wait_for(lambda: watcher.committed(part) is not None, timeout_s=30, what="a commit")
        committed = watcher.committed(part)
        executor.kill9()
    finally:
        executor.stop()
        watcher.close()
    assert committed == tail[0].offset, "the commit is held at the first chunk of the batch being assembled"
    late = built.model_copy(update={"event_id": "late", "batch_id": later, "trajectory_id": later})
    _send(broker.bootstrap, [late])
    again = _executor(broker, data_dir, "executor-2.log")
    assert again.popen.wait(timeout=300) == 0, again.log_text()[-3000:]
    again.stop()
    trained = [b for u in _updates(broker.bootstrap) for b in u.batch_ids]
    assert (sorted(trained[:-1]), trained[-1]) == ([m.batch_id for m in built_first], later), (
        "nothing lost, nothing trained twice"
    )
    assert not [e for _, e in _read_all(broker.bootstrap, topics.DLQ) if e.stage == "executor"]


def test_a_batch_set_aside_by_a_flood_of_fake_batch_ids_is_read_again_from_the_log(broker, tmp_path):
    from clients.kafka import ensure_topics

    ensure_topics(broker.bootstrap)
    _send(broker.bootstrap, synthetic(8, group_size=4))
    built_first = _build(broker, tmp_path / "trainer", "trainer")
    *chunks, built = built_first[0].events()
    shutil.rmtree(tmp_path / "trainer" / "batches")
    flooded = "sft-flooded"
    fakes = [  # more never-completed batches than the executor keeps open (16): its chunks are set aside
        chunk_events(f"sft-fake-{n}", "sft", [{"messages": []}], built.occurred_at, "tests")[0]
        for n in range(24)
    ]
    late = built.model_copy(update={"event_id": "flooded", "batch_id": flooded, "trajectory_id": flooded})
    renamed = [c.model_copy(update={"batch_id": flooded, "trajectory_id": flooded}) for c in chunks]
    _send(broker.bootstrap, [*renamed, *fakes, late])
    executor = _executor(broker, tmp_path / "executor", "executor.log")
    assert executor.popen.wait(timeout=300) == 0, executor.log_text()[-3000:]
    executor.stop()
    assert f"reading the chunks of {flooded} again" in executor.log_text(), executor.log_text()[-3000:]
    trained = [b for u in _updates(broker.bootstrap) for b in u.batch_ids]
    assert sorted(trained) == sorted([m.batch_id for m in built_first] + [flooded]), "each batch once"
    assert not [e for _, e in _read_all(broker.bootstrap, topics.DLQ) if e.stage == "executor"]

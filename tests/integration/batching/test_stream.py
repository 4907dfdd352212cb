"""Integration: the trainer consumer against the real embedded broker (kafka-python over TCP).

- exactly-once: kill -9 the consumer several times while 1,000 trajectories stream in; at the end
  every eligible trajectory is in exactly one batch of each kind, and every manifest has its
  `batch.built` event (duplicates only with the same event id).
- the executor follows `training.batches` and publishes `policy.updated`; a record there it cannot
  train on reaches the DLQ with its coordinates and the next batch still trains.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from consumers.batching.batch_writer import BatchStore, read_rows
from consumers.batching.builders.common import reward_of
from consumers.batching.row_chunks import rows_sha256
from schemas import topics
from schemas.codec import decode, encode
from tests.support.processes import AGENTSTREAM, Proc, wait_for
from tests.support.trainer_data import synthetic

pytestmark = pytest.mark.integration

GROUP = 4


def _producer(bootstrap):
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)


def _publish(producer, trajectories):
    futures = [
        producer.send(topics.TRAJECTORY_SCORED, key=t.trajectory_id.encode(), value=encode(t))
        for t in trajectories
    ]
    for f in futures:
        f.get(timeout=30)


def _read_all(bootstrap, topic):
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=1500)
    parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    events = [decode(r.value) for r in consumer]
    consumer.close()
    return events


def _send_batch(producer, manifest):
    """The batch as the trainer publishes it: its batch.rows chunks, then its batch.built."""
    sent = [
        producer.send(topics.TRAINING_BATCHES, key=e.trajectory_id.encode(), value=encode(e)).get(30)
        for e in manifest.events()
    ]
    return sent[-1]


def _trainer(broker, data_dir, log_name):
    args = [*AGENTSTREAM, "batch", "--bootstrap-servers", broker.bootstrap, "--data-dir", str(data_dir)]
    args += ["--kinds", "sft,dpo,dpo_step,grpo", "--batch-trajectories", "40", "--flush-interval-s", "0.3"]
    args += ["--group-size", str(GROUP), "--group-timeout-s", "600", "--log-level", "INFO", "--retokenize"]
    return Proc(args, data_dir.parent / log_name)


def test_exactly_once_under_kill9(broker, data_dir):
    from clients.kafka import ensure_topics

    ensure_topics(broker.bootstrap)
    trajectories = synthetic(1000, group_size=GROUP)
    # content copies under new ids: dedup must keep them out of every batch
    copies = [t.model_copy(update={"trajectory_id": f"copy-{t.trajectory_id}"}) for t in trajectories[:20]]
    producer = _producer(broker.bootstrap)
    store = BatchStore(data_dir)
    rng = random.Random(7)
    proc = _trainer(broker, data_dir, "trainer-0.log")
    try:
        for round_ in range(5):
            _publish(
                producer, trajectories[round_ * 200 : (round_ + 1) * 200] + (copies if round_ == 1 else [])
            )
            before = len(store.manifests())
            wait_for(lambda b=before: len(store.manifests()) > b, timeout_s=60, what="a new batch")
            time.sleep(rng.uniform(0.0, 0.3))  # kill somewhere in the middle of the next batches
            proc.kill9()
            proc = _trainer(broker, data_dir, f"trainer-{round_ + 1}.log")
        eligible_sft = {t.trajectory_id for t in trajectories if t.success and t.steps}
        every = {t.trajectory_id for t in trajectories if reward_of(t) is not None}

        def done():
            have = {
                k: Counter(i for m in store.manifests(k) for i in m.trajectory_ids)
                for k in ("sft", "grpo", "dpo", "dpo_step")
            }
            complete = set(have["sft"]) >= eligible_sft and all(
                set(have[k]) >= every for k in ("grpo", "dpo", "dpo_step")
            )
            return complete and have

        try:
            counts = wait_for(done, timeout_s=240, interval_s=0.5, what="all trajectories batched")
        except TimeoutError:
            have = {
                k: {i for m in store.manifests(k) for i in m.trajectory_ids} for k in ("sft", "grpo", "dpo")
            }
            missing = {k: len((eligible_sft if k == "sft" else every) - v) for k, v in have.items()}
            raise AssertionError(
                f"not batched after 240 s: {missing}; log: {proc.log_text()[-2000:]}"
            ) from None
        time.sleep(1.0)  # anything extra (a duplicate batch) would show up now
        counts = done()
    finally:
        proc.stop()
        producer.close()
    assert set(counts["sft"]) == eligible_sft
    assert all(set(counts[k]) == every for k in ("grpo", "dpo", "dpo_step")), "copies were deduplicated"
    for kind, counter in counts.items():
        dupes = {i: n for i, n in counter.items() if n > 1}
        assert not dupes, f"{kind}: trajectories in more than one batch: {list(dupes)[:5]}"
    records = _read_all(broker.bootstrap, topics.TRAINING_BATCHES)
    events = [e for e in records if e.type == "batch.built"]
    by_batch = {}
    for e in events:
        by_batch.setdefault(e.batch_id, set()).add(e.event_id)
    chunks = {}  # the rows travel in the log: every batch's chunks hash to its rows_sha256
    for c in records:
        if c.type == "batch.rows":
            chunks.setdefault((c.batch_id, c.rows_sha256), {})[c.index] = c.rows
    for e in events:
        parts = chunks[(e.batch_id, e.rows_sha256)]
        assert sorted(parts) == list(range(e.chunks)), e.batch_id
        assert rows_sha256([r for i in sorted(parts) for r in parts[i]]) == e.rows_sha256 == e.sha256
    manifests = store.manifests()
    assert {m.batch_id for m in manifests} == set(by_batch), (
        "every manifest has its batch.built and vice versa"
    )
    assert all(len(ids) == 1 for ids in by_batch.values()), "a re-published batch keeps its event id"
    grpo_rows = sum(m.row_count for m in store.manifests("grpo"))
    assert grpo_rows == 1000
    assert all(m.extra["incomplete_groups"] == 0 for m in store.manifests("grpo"))


def test_republishes_a_batch_whose_event_was_lost(broker, data_dir):
    from clients.kafka import ensure_topics

    ensure_topics(broker.bootstrap)
    meta = {
        "trajectory_ids": ["t1"],
        "content_hashes": ["h1"],
        "source_offsets": {},
        "reward_versions": [],
        "calibration_versions": [],
        "policy_versions": [],
        "builder_config": {},
    }
    manifest = BatchStore(data_dir).write("sft", [{"messages": []}], meta)  # no .published marker
    producer = _producer(broker.bootstrap)  # bad input: not JSON, and the wrong event type
    producer.send(topics.TRAJECTORY_SCORED, key=b"bad", value=b"not json").get(30)
    producer.send(topics.TRAJECTORY_SCORED, key=b"wrong", value=encode(manifest.event())).get(30)
    producer.close()

    def republished():
        return any(
            e.type == "batch.built" and e.batch_id == manifest.batch_id
            for e in _read_all(broker.bootstrap, topics.TRAINING_BATCHES)
        )

    def dead_letters():
        found = _read_all(broker.bootstrap, topics.DLQ)
        return len(found) == 2 and found

    proc = _trainer(broker, data_dir, "trainer.log")
    try:
        wait_for(republished, timeout_s=60, what="the lost batch.built to be re-published")
        letters = wait_for(dead_letters, timeout_s=60, what="two dead letters")
    finally:
        proc.stop()
    [chunk, event] = _read_all(broker.bootstrap, topics.TRAINING_BATCHES)
    assert event.event_id == manifest.event().event_id
    assert (chunk.type, chunk.rows, event.chunks) == ("batch.rows", [{"messages": []}], 1)
    assert {(d.stage, d.source_topic, d.source_key) for d in letters} == {
        ("trainer", topics.TRAJECTORY_SCORED, "bad"),
        ("trainer", topics.TRAJECTORY_SCORED, "wrong"),
    }
    assert any("not valid JSON" in d.reason for d in letters) and any(
        "batch.built" in d.reason for d in letters
    )


def _sft_manifest(data_dir):
    """One SFT batch file with its manifest, from the golden group."""
    from consumers.batching.builders.sft import SFTBuilder, SFTBuilderConfig
    from tests.support.trainer_data import golden_group

    rows = SFTBuilder(SFTBuilderConfig(require_success=False)).build(golden_group())
    meta = {"trajectory_ids": [r["trajectory_id"] for r in rows], "content_hashes": [], "source_offsets": {},
            "reward_versions": [], "calibration_versions": [], "policy_versions": [],
            "builder_config": {}}  # fmt: skip
    return BatchStore(data_dir).write("sft", rows, meta)


def test_executor_follows_batches_and_publishes_policy_updates(broker, data_dir):
    from clients.kafka import ensure_topics

    ensure_topics(broker.bootstrap)
    manifest = _sft_manifest(data_dir)
    producer = _producer(broker.bootstrap)
    _send_batch(producer, manifest)
    producer.close()
    common = ["--bootstrap-servers", broker.bootstrap, "--data-dir", str(data_dir), "--base-model", "tiny"]
    follow = Proc(
        [*AGENTSTREAM, "train", "--follow", "--idle-exit-s", "3", *common], data_dir.parent / "follow.log"
    )
    assert follow.popen.wait(timeout=180) == 0, follow.log_text()[-3000:]
    follow.stop()
    [update] = _read_all(broker.bootstrap, topics.POLICY_UPDATES)
    assert (update.policy_version, update.method, update.batch_ids) == ("v1", "sft", [manifest.batch_id])
    assert (data_dir / "checkpoints" / "v1" / "adapter").is_dir()
    # one batch file directly: v2, and the follow replay above did not train twice
    once = Proc([*AGENTSTREAM, "train", "--batch", manifest.path, *common], data_dir.parent / "batch.log")
    assert once.popen.wait(timeout=180) == 0, once.log_text()[-3000:]
    once.stop()
    versions = [e.policy_version for e in _read_all(broker.bootstrap, topics.POLICY_UPDATES)]
    assert versions == ["v1", "v2"]


def test_tokenized_parquet_batches_and_idle_exit(broker, data_dir):
    from clients.kafka import ensure_topics

    ensure_topics(broker.bootstrap)
    producer = _producer(broker.bootstrap)
    _publish(producer, synthetic(16, group_size=GROUP))
    producer.close()
    args = [*AGENTSTREAM, "batch", "--bootstrap-servers", broker.bootstrap, "--data-dir", str(data_dir)]
    args += [
        "--kinds",
        "sft_tokenized,grpo",
        "--tokenizer",
        "tiny",
        "--format",
        "parquet",
        "--idle-exit-s",
        "2",
        "--retokenize",
    ]
    proc = Proc([*args, "--flush-interval-s", "0.2", "--max-length", "550"], data_dir.parent / "trainer.log")
    assert proc.popen.wait(timeout=120) == 0, proc.log_text()[-3000:]
    proc.stop()
    store = BatchStore(data_dir)
    [grpo] = store.manifests("grpo")
    assert grpo.format == "parquet" and grpo.row_count == 16
    rows = [r for m in store.manifests("sft_tokenized") for r in read_rows(m.path)]
    assert {r["trajectory_id"] for r in rows} == {t.trajectory_id for t in synthetic(16) if t.success}
    assert all(len(r["input_ids"]) == len(r["labels"]) <= 550 for r in rows)
    assert any(
        r["num_chunks"] > 1 for r in rows
    )  # 550 tokens (the prompt is ~360) forces step-boundary chunks


def test_a_bad_batch_record_is_dead_lettered_with_its_coordinates_and_the_executor_goes_on(broker, data_dir):
    from clients.kafka import ensure_topics

    ensure_topics(broker.bootstrap)
    manifest = _sft_manifest(data_dir)
    producer = _producer(broker.bootstrap)
    bad = producer.send(topics.TRAINING_BATCHES, key=b"bad-batch", value=b"{not a batch").get(30)
    good = _send_batch(producer, manifest)
    producer.close()
    assert (bad.partition, bad.offset) != (good.partition, good.offset)
    common = ["--bootstrap-servers", broker.bootstrap, "--data-dir", str(data_dir), "--base-model", "tiny"]
    follow = Proc(
        [*AGENTSTREAM, "train", "--follow", "--idle-exit-s", "3", *common], data_dir.parent / "follow.log"
    )
    assert follow.popen.wait(timeout=180) == 0, follow.log_text()[-3000:]
    follow.stop()
    [letter] = [d for d in _read_all(broker.bootstrap, topics.DLQ) if d.stage == "executor"]
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == (
        topics.TRAINING_BATCHES,
        bad.partition,
        bad.offset,
    )
    assert letter.payload == "{not a batch" and letter.source_key == "bad-batch"
    [update] = _read_all(broker.bootstrap, topics.POLICY_UPDATES)
    assert (update.policy_version, update.batch_ids) == ("v1", [manifest.batch_id])

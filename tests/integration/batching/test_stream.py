"""Integration: the trainer consumer against the real embedded broker (kafka-python over TCP).

- exactly-once: kill -9 the consumer several times while 1,000 trajectories and 20 content copies
  (new ids) stream in; at the end every eligible content is in exactly one batch of each kind (the
  original or its copy: after a kill, replay reads the partitions in no fixed order, so either may
  come first), no trajectory is in two batches, and every manifest has its `batch.built` event
  (duplicates only with the same event id).
- a row too large for any `batch.rows` event: its trajectory (its group, for GRPO) is dead-lettered
  with its coordinates and left out, the rest of the batch is published, and the builder exits 0.
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
from consumers.batching.builders.dedup import content_hash
from consumers.batching.row_chunks import rows_sha256
from schemas import topics
from schemas.codec import decode, encode
from tests.support.processes import AGENTSTREAM, Proc, wait_for
from tests.support.trainer_data import synthetic

pytestmark = pytest.mark.integration

GROUP = 4
KINDS = ("sft", "grpo", "dpo", "dpo_step")


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
    # content copies under new ids: dedup keeps one of each content (the original or the copy)
    copies = [t.model_copy(update={"trajectory_id": f"copy-{t.trajectory_id}"}) for t in trajectories[:20]]
    content = {t.trajectory_id: content_hash(t) for t in trajectories + copies}
    assert len({content[t.trajectory_id] for t in trajectories}) == len(trajectories), "distinct contents"
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
        expected = {k: {content[i] for i in (eligible_sft if k == "sft" else every)} for k in KINDS}

        def batched():
            return {k: Counter(i for m in store.manifests(k) for i in m.trajectory_ids) for k in KINDS}

        def done():
            have = batched()
            complete = all({content.get(i) for i in have[k]} >= expected[k] for k in KINDS)
            return complete and have

        try:
            wait_for(done, timeout_s=240, interval_s=0.5, what="all trajectories batched")
        except TimeoutError:
            have = batched()
            missing = {k: len(expected[k] - {content.get(i) for i in have[k]}) for k in KINDS}
            raise AssertionError(
                f"contents not batched after 240 s: {missing}; log: {proc.log_text()[-2000:]}"
            ) from None
        time.sleep(1.0)  # anything extra (a duplicate batch) would show up now
        counts = batched()
    finally:
        proc.stop()
        producer.close()
    for kind, counter in counts.items():
        assert set(counter) <= set(content), (
            f"{kind}: batched ids never published: {set(counter) - set(content)}"
        )
        dupes = {i: n for i, n in counter.items() if n > 1}
        assert not dupes, f"{kind}: trajectories in more than one batch: {list(dupes)[:5]}"
        per_content = Counter(content[i] for i in counter)
        twice = [i for i in counter if per_content[content[i]] > 1]
        assert not twice, f"{kind}: one content batched under several ids (dedup failed): {sorted(twice)[:6]}"
        assert set(per_content) == expected[kind], f"{kind}: contents lost or extra"
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


def test_a_row_too_large_for_any_event_is_dead_lettered_and_the_rest_published(broker, data_dir):
    from clients.kafka import ensure_topics
    from tests.support.trainer_data import scored, step

    ensure_topics(broker.bootstrap)

    # member 3 of task-a called a tool with 300,000 quotes: 0.6 MB in its event, 1.2 MB in its rows
    # (the arguments are JSON inside the row's JSON), more than one batch.rows event can carry
    def member(task, i):
        cmd = '"' * 300_000 if (task, i) == ("task-a", 3) else f"ls {i}"
        return scored(f"{task}-{i}", task, i / 4, [step("look", "bash", "ok", 0.5, cmd=cmd)], success=True)

    trajectories = [member(task, i) for task in ("task-a", "task-b") for i in range(GROUP)]
    producer = _producer(broker.bootstrap)
    sent = {
        t.trajectory_id: producer.send(
            topics.TRAJECTORY_SCORED, key=t.trajectory_id.encode(), value=encode(t)
        ).get(30)
        for t in trajectories
    }
    producer.close()
    args = [*AGENTSTREAM, "batch", "--bootstrap-servers", broker.bootstrap, "--data-dir", str(data_dir)]
    args += ["--kinds", "sft,grpo", "--group-size", str(GROUP), "--flush-interval-s", "0.3", "--retokenize"]
    for run in range(2):  # the second run (a restart) has nothing left to fail on
        proc = Proc([*args, "--idle-exit-s", "2"], data_dir.parent / f"batch-{run}.log")
        assert proc.popen.wait(timeout=60) == 0, proc.log_text()[-3000:]
        proc.stop()
    store = BatchStore(data_dir)
    [sft], [grpo] = store.manifests("sft"), store.manifests("grpo")
    assert sorted(sft.trajectory_ids) == sorted(
        t.trajectory_id for t in trajectories if t.trajectory_id != "task-a-3"
    )
    assert sorted(grpo.trajectory_ids) == [f"task-b-{i}" for i in range(GROUP)]
    assert (sft.builder_config["left_out_by_row_size"], grpo.builder_config["left_out_by_row_size"]) == (1, 4)
    built = {
        e.batch_id for e in _read_all(broker.bootstrap, topics.TRAINING_BATCHES) if e.type == "batch.built"
    }
    assert built == {sft.batch_id, grpo.batch_id}
    letters = _read_all(broker.bootstrap, topics.DLQ)
    coordinates = {(d.trajectory_id, d.source_topic, d.source_partition, d.source_offset) for d in letters}
    assert coordinates == {
        (f"task-a-{i}", topics.TRAJECTORY_SCORED, sent[f"task-a-{i}"].partition, sent[f"task-a-{i}"].offset)
        for i in range(GROUP)
    }
    assert all(d.stage == "trainer" and d.error_type == "RowTooLarge" for d in letters)
    assert any(f"published as batch {grpo.batch_id}" in d.reason for d in letters)
    assert any("(sft): row " in d.reason and "(trajectory task-a-3) takes " in d.reason for d in letters)

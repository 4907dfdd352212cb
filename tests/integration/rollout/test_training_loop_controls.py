"""The rollout's training-loop controls against the embedded broker: the horizon follows the
policy's training step from `policy.updates`, and the backpressure gate pauses while
`training.batches` is more than `max_staleness` ahead of `policy.updates`, then resumes."""

from __future__ import annotations

import time

from clients.kafka import ensure_topics, make_producer
from producers.rollout.backpressure import BackpressureGate, TopicBacklog
from producers.rollout.driver import RolloutConfig, TrainingLoopControls
from producers.rollout.horizon import PolicyProgress
from schemas.codec import encode
from schemas.events import BatchBuilt, PolicyUpdated, utc_now
from schemas.ids import new_event_id
from schemas.topics import POLICY_UPDATES, TOPICS, TRAINING_BATCHES


def _common(key: str) -> dict:
    return {"event_id": new_event_id(), "trajectory_id": key, "occurred_at": utc_now(), "producer": "tests"}


def publish_updates(bootstrap: str, steps: list[int]) -> None:
    producer = make_producer(bootstrap, "tests-rollout")
    for step in steps:
        event = PolicyUpdated(**_common(f"v{step}"), policy_version=f"v{step}", step=step)
        producer.send(POLICY_UPDATES, key=f"v{step}".encode(), value=encode(event)).get(10)
    producer.close()


def publish_batches(bootstrap: str, count: int) -> None:
    producer = make_producer(bootstrap, "tests-rollout")
    for _ in range(count):
        batch_id = new_event_id()
        event = BatchBuilt(**_common(batch_id), batch_id=batch_id, kind="grpo", path="/b.jsonl", row_count=4)
        producer.send(TRAINING_BATCHES, key=batch_id.encode(), value=encode(event)).get(10)
    producer.close()


def test_the_horizon_grows_with_the_published_training_step(broker):
    ensure_topics(broker.bootstrap, [TOPICS[POLICY_UPDATES], TOPICS[TRAINING_BATCHES]])
    config = RolloutConfig(max_turns=16, horizon="0=2,10=4,20=8", progress_poll_s=0.1)
    controls = TrainingLoopControls.from_config(config, broker.bootstrap)
    try:
        assert controls.before_episode() == 0 and config.turn_limit(0) == 2  # empty topic: step 0
        publish_updates(broker.bootstrap, [5, 12])
        time.sleep(0.15)
        step = controls.before_episode()
        assert (step, controls.progress.version(), config.turn_limit(step)) == (12, "v12", 4)
        publish_updates(broker.bootstrap, [25])
        time.sleep(0.15)
        assert config.turn_limit(controls.before_episode()) == 8
    finally:
        controls.close()


def test_the_gate_pauses_beyond_max_staleness_and_resumes_after_an_update(broker):
    ensure_topics(broker.bootstrap, [TOPICS[POLICY_UPDATES], TOPICS[TRAINING_BATCHES]])
    gate = BackpressureGate(TopicBacklog(broker.bootstrap), max_staleness=2, poll_s=0.05)
    try:
        publish_batches(broker.bootstrap, 2)
        assert gate.check() is False  # 2 batches waiting: at the limit, not beyond
        publish_batches(broker.bootstrap, 1)
        assert gate.check() is True and gate.paused and gate.pauses == 1
        publish_updates(broker.bootstrap, [1])
        assert gate.check() is False and not gate.paused
        gate.wait()  # returns at once now
    finally:
        gate.backlog.close()


def test_a_batch_the_executor_finished_without_a_version_releases_the_gate(broker):
    """The executor commits a batch that made no version (every group stale, or no rows); counting
    only policy.updates would keep the rollout paused for good."""
    from kafka import OffsetAndMetadata, TopicPartition

    from clients.kafka import make_consumer

    ensure_topics(broker.bootstrap, [TOPICS[POLICY_UPDATES], TOPICS[TRAINING_BATCHES]])
    gate = BackpressureGate(TopicBacklog(broker.bootstrap, executor_group="tests-exec"), 1, poll_s=0.05)
    executor = make_consumer(broker.bootstrap, "tests-executor", "tests-exec")
    try:
        publish_batches(broker.bootstrap, 3)
        assert gate.check() is True  # 3 batches, none handled
        part = TopicPartition(TRAINING_BATCHES, 0)
        executor.assign([part])
        executor.commit({part: OffsetAndMetadata(2, "", -1)})  # two batches done, no version made
        assert gate.check() is False and not gate.paused
    finally:
        executor.close()
        gate.backlog.close()


def test_an_unreachable_broker_leaves_step_zero_and_does_not_pause():
    progress = PolicyProgress("127.0.0.1:1", poll_s=60, timeout_ms=1000)
    gate = BackpressureGate(TopicBacklog("127.0.0.1:1", timeout_ms=1000), max_staleness=1, sleep=_never)
    started = time.monotonic()
    try:
        assert progress.step() == 0 and progress.version() is None
        gate.wait()
        assert not gate.paused
    finally:
        progress.close()
        gate.backlog.close()
    assert time.monotonic() - started < 10


def _never(seconds: float) -> None:
    raise AssertionError(f"the gate slept {seconds} s with no broker to read")


def test_batch_rows_chunks_are_not_counted_as_batches(broker):
    """Since 1.5 a batch's rows travel before its batch.built as batch.rows chunks: the backlog counts
    batch.built records (read once each), not the topic's records."""
    from kafka import OffsetAndMetadata, TopicPartition

    from clients.kafka import make_consumer
    from consumers.batching.row_chunks import chunk_events

    ensure_topics(broker.bootstrap, [TOPICS[POLICY_UPDATES], TOPICS[TRAINING_BATCHES]])
    producer = make_producer(broker.bootstrap, "tests-rollout")
    chunks = chunk_events("b0", "grpo", [{"x": "y" * 100}] * 6, utc_now(), "tests", chunk_bytes=300)
    assert len(chunks) == 3
    for chunk in chunks:
        producer.send(TRAINING_BATCHES, key=b"b0", value=encode(chunk)).get(10)
    producer.close()
    publish_batches(broker.bootstrap, 1)  # offset 3
    backlog = TopicBacklog(broker.bootstrap, executor_group="tests-exec")
    executor = make_consumer(broker.bootstrap, "tests-executor", "tests-exec")
    try:
        assert (backlog.read().batches, backlog.read().updates) == (1, 0)
        publish_batches(broker.bootstrap, 2)
        part = TopicPartition(TRAINING_BATCHES, 0)
        executor.assign([part])
        executor.commit({part: OffsetAndMetadata(4, "", -1)})  # the first batch handled
        assert (backlog.read().batches, backlog.read().updates) == (3, 1)
    finally:
        executor.close()
        backlog.close()

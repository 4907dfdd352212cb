"""Integration: the executor publishes every policy version exactly once.

- kill -9 of `agentstream train --follow` while it trains (right after the first `policy.updated`),
  then a restart: `policy.updates` holds v1..vN with no gap and no duplicate, and every batch is in
  exactly one version's `batch_ids`.
- the restart rule on its own: the latest checkpoint's event is published only when the topic lacks
  it (the process died between checkpoint and publish), never a second time.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest

from schemas import topics
from schemas.codec import decode
from schemas.events import PolicyUpdated
from tests.support.processes import AGENTSTREAM, Proc, wait_for
from tests.support.trainer_data import publish_sft_batches

pytestmark = pytest.mark.integration

BATCHES = 5


def _read_all(bootstrap, topic):
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=1500)
    parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    events = [decode(r.value) for r in consumer]
    consumer.close()
    return events


def _published(consumer, parts) -> int:
    """How many policy.updated records the topic holds now (end offsets: no waiting for records)."""
    return sum(consumer.end_offsets(parts).values())


def test_kill9_mid_update_publishes_each_version_once(broker, data_dir):
    from clients.kafka import ensure_topics

    ensure_topics(broker.bootstrap)
    batch_ids = publish_sft_batches(broker.bootstrap, data_dir, BATCHES)
    common = ["train", "--follow", "--bootstrap-servers", broker.bootstrap, "--data-dir", str(data_dir)]
    common += ["--base-model", "tiny", "--kinds", "sft"]
    from kafka import KafkaConsumer, TopicPartition

    watcher = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    parts = [
        TopicPartition(topics.POLICY_UPDATES, p) for p in watcher.partitions_for_topic(topics.POLICY_UPDATES)
    ]
    first = Proc([*AGENTSTREAM, *common], data_dir.parent / "executor-1.log")
    try:
        wait_for(lambda: _published(watcher, parts), timeout_s=120, interval_s=0.01, what="v1")
        first.kill9()  # the next batch is training or checkpointing now
        killed_after = _published(watcher, parts)
    finally:
        first.stop()
        watcher.close()
    assert killed_after < BATCHES, "the kill came after the last update: nothing was tested"
    second = Proc([*AGENTSTREAM, *common, "--idle-exit-s", "3"], data_dir.parent / "executor-2.log")
    try:
        assert second.popen.wait(timeout=180) == 0, second.log_text()[-3000:]
    finally:
        second.stop()
    updates = _read_all(broker.bootstrap, topics.POLICY_UPDATES)
    assert [u.policy_version for u in updates] == [f"v{i}" for i in range(1, BATCHES + 1)]
    assert [u.previous_version for u in updates] == [None, *(f"v{i}" for i in range(1, BATCHES))]
    trained = Counter(b for u in updates for b in u.batch_ids)
    assert trained == Counter(batch_ids)


def test_restart_publishes_the_checkpoint_event_only_when_missing(broker):
    from clients.kafka import ensure_topics, make_producer
    from consumers.training.follow import publish_unpublished

    ensure_topics(broker.bootstrap)
    event = PolicyUpdated(
        event_id="pu-v1", trajectory_id="v1", occurred_at=datetime(2026, 11, 1, tzinfo=UTC),
        producer="trainer-executor", policy_version="v1", batch_ids=["b1"],
    )  # fmt: skip
    last_event = event.model_dump(mode="json")
    producer = make_producer(broker.bootstrap, "test")
    try:
        assert publish_unpublished(broker.bootstrap, producer, None) is False
        assert publish_unpublished(broker.bootstrap, producer, last_event) is True  # died before publish
        assert publish_unpublished(broker.bootstrap, producer, last_event) is False  # already there
    finally:
        producer.close()
    assert [e.event_id for e in _read_all(broker.bootstrap, topics.POLICY_UPDATES)] == ["pu-v1"]

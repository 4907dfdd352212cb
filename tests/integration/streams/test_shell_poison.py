"""The batch shell's poison path (issue #34), on the real shell, faust and aiokafka over the embedded
broker: a real worker (tests/support/poison_app.py) whose test processor raises on chosen records.

A batch whose processing raises for the record's sake (a plain ValueError, an output that cannot be
encoded) is processed again one record at a time: the others' outputs are published once, only the
failing records are dead-lettered with their coordinates, offsets are committed past them and the
worker keeps running. A retryable error (ConnectionError) dead-letters nothing, publishes nothing of
its batch, commits nothing past it and exits with EXIT_REPLAY; the restarted worker starts after the
poison and replays that batch."""

from __future__ import annotations

import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from clients.kafka import ensure_topics
from schemas import topics
from schemas.codec import encode, encode_key
from schemas.events import DeadLetter, RuleRewardStep, StepRecorded
from streams.config import EXIT_REPLAY
from tests.support.poison_app import APP_ID, SOURCE_TOPIC, STAGE
from tests.support.processes import Proc, wait_for
from tests.support.streams_helpers import producer, read_topic

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _step(tid: str) -> StepRecorded:
    return StepRecorded(
        event_id=f"{tid}:step", trajectory_id=tid, occurred_at=T0, producer="test", step_index=0, tool="ls"
    )


def _publish(bootstrap: str, *tids: str) -> None:
    """One step per trajectory id, in order, onto partition 0 of the source topic (one flush, so
    the worker fetches them together)."""
    prod = producer(bootstrap)
    try:
        for tid in tids:
            step = _step(tid)
            prod.send(SOURCE_TOPIC, key=encode_key(step), value=encode(step), partition=0)
        prod.flush(timeout=30)
    finally:
        prod.close()


def _committed(bootstrap: str) -> int | None:
    """The worker group's committed offset on the source partition."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=APP_ID, enable_auto_commit=False)
    try:
        return consumer.committed(TopicPartition(SOURCE_TOPIC, 0))
    finally:
        consumer.close()


def _rewards(bootstrap: str) -> Counter:
    """How many times each reward was published (raw messages: a duplicate counts twice)."""
    events = read_topic(bootstrap, topics.REWARD_RULE)
    assert all(isinstance(e, RuleRewardStep) for e in events)
    return Counter(e.source_event_id.removesuffix(":step") for e in events)


def _letters(bootstrap: str) -> list[DeadLetter]:
    return read_topic(bootstrap, topics.DLQ)


def _state_keys(bootstrap: str) -> Counter:
    """The keys written to the role's state changelog (raw messages: a rewrite counts twice)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tp = TopicPartition(f"{APP_ID}-state-changelog", 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end, keys = consumer.end_offsets([tp])[tp], Counter()
        for _ in range(50):  # bounded: a few polls read a handful of records
            if consumer.position(tp) >= end:
                break
            for records in consumer.poll(timeout_ms=500).values():
                keys.update(r.key.decode() for r in records)
        return keys
    finally:
        consumer.close()


def _calls(path: Path) -> list[list[int]]:
    """The offsets of each call of the test processor, in order."""
    text = path.read_text() if path.exists() else ""
    return [[int(o) for o in line.split()] for line in text.splitlines()]


def _worker(bootstrap: str, tmp_path: Path, n: int) -> Proc:
    env = {
        "POISON_TEST_BOOTSTRAP": bootstrap,
        "POISON_TEST_DATADIR": str(tmp_path / f"faust-{n}"),
        "POISON_TEST_CALLS": str(tmp_path / f"calls-{n}.txt"),
        "POISON_TEST_FLAKY": str(tmp_path / "flaky"),
    }
    args = [sys.executable, "-m", "tests.support.poison_app", "worker", "-l", "info"]
    return Proc(args, tmp_path / f"worker-{n}.log", env)


def _exit_code(worker: Proc, timeout_s: float) -> int:
    wait_for(lambda: not worker.alive(), timeout_s, what="the worker to exit")
    return worker.popen.returncode


def test_poison_is_dead_lettered_alone_and_retryable_errors_replay(broker, tmp_path):
    bootstrap = broker.bootstrap
    ensure_topics(bootstrap)
    ensure_topics(bootstrap, [topics.TopicSpec(SOURCE_TOPIC, ("step.recorded",), partitions=1)])
    flaky = tmp_path / "flaky"
    calls_1, calls_2 = tmp_path / "calls-1.txt", tmp_path / "calls-2.txt"

    # 1. one batch with two poison records among good ones (offsets 0..5)
    _publish(bootstrap, "ok-0", "ok-1", "poison", "ok-2", "unencodable", "ok-3")
    worker = _worker(bootstrap, tmp_path, 1)
    try:
        wait_for(lambda: _committed(bootstrap) == 6, 45, 0.2, what="offsets committed past the batch")
        assert worker.alive(), worker.log_text()[-3000:]
        calls = _calls(calls_1)
        # the batch was processed whole first (so the one-at-a-time path is what ran), then alone
        assert calls == [[0, 1, 2, 3, 4, 5], [0], [1], [2], [3], [4], [5]], calls
        assert _rewards(bootstrap) == {"ok-0": 1, "ok-1": 1, "ok-2": 1, "ok-3": 1}
        assert _state_keys(bootstrap) == {"ok-0": 1, "ok-1": 1, "ok-2": 1, "ok-3": 1}
        letters = _letters(bootstrap)
        assert [(d.source_topic, d.source_partition, d.source_offset) for d in letters] == [
            (SOURCE_TOPIC, 0, 2),
            (SOURCE_TOPIC, 0, 4),
        ]
        poison, unencodable = letters
        assert (poison.stage, poison.error_type, poison.trajectory_id) == (STAGE, "ValueError", "poison")
        assert "this record is poison" in poison.reason and poison.source_key == "poison"
        assert unencodable.error_type == "PydanticSerializationError" and "object" in unencodable.reason
        assert poison.payload == encode(_step("poison")).decode()

        # 2. a retryable error: exit to replay; nothing of the batch published or dead-lettered
        flaky.touch()
        _publish(bootstrap, "ok-4", "flaky")  # offsets 6, 7
        assert _exit_code(worker, 30) == EXIT_REPLAY, worker.log_text()[-3000:]
    finally:
        worker.stop()
    assert _calls(calls_1)[7:] == [[6, 7]]  # one batch, not split
    assert _committed(bootstrap) == 6
    assert "ok-4" not in _rewards(bootstrap)
    assert len(_letters(bootstrap)) == 2

    # 3. the world is back: a restarted worker starts after the poison and replays the failed batch
    flaky.unlink()
    worker = _worker(bootstrap, tmp_path, 2)
    try:
        wait_for(lambda: _committed(bootstrap) == 8, 45, 0.2, what="the replayed batch committed")
        assert worker.alive(), worker.log_text()[-3000:]
        assert _calls(calls_2) == [[6, 7]]  # neither the poison nor anything before it read again
        assert _rewards(bootstrap) == {f"ok-{i}": 1 for i in range(5)} | {"flaky": 1}
        assert len(_letters(bootstrap)) == 2

        # 4. a retryable error while the batch runs one at a time also exits, and is no dead letter
        flaky.touch()
        _publish(bootstrap, "ok-5", "poison-2", "flaky-2")  # offsets 8, 9, 10
        assert _exit_code(worker, 30) == EXIT_REPLAY, worker.log_text()[-3000:]
    finally:
        worker.stop()
    assert _calls(calls_2)[1:] == [[8, 9, 10], [8], [9], [10]]
    assert [d.source_offset for d in _letters(bootstrap)] == [2, 4, 9]
    assert _committed(bootstrap) == 8

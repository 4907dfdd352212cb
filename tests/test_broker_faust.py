"""A faust worker (agent + table) against the embedded broker, as a real subprocess (issue 3).

The worker counts words into a memory-backed table. Restarted, it must rebuild the table from its
changelog topic and resume from the committed offset: the counts continue instead of restarting
at 1, and no event is processed twice.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from tests.broker_fixtures.faust_app import APP_ID, WORDS_TOPIC
from tests.support.processes import Proc, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def send_words(bootstrap: str, words: list[str]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for word in words:
        producer.send(WORDS_TOPIC, key=word.encode(), value=word.encode())
    producer.flush()
    producer.close()


def committed_offset(bootstrap: str) -> int | None:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=APP_ID, enable_auto_commit=False)
    try:
        return consumer.committed(TopicPartition(WORDS_TOPIC, 0))
    finally:
        consumer.close()


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def start_worker(bootstrap: str, tmp_path: Path, out: Path, run: int) -> Proc:
    env = {
        "BROKER_TEST_BOOTSTRAP": bootstrap,
        "BROKER_TEST_OUT": str(out),
        "BROKER_TEST_DATADIR": str(tmp_path / "faust-data"),
    }
    args = [sys.executable, "-m", "tests.broker_fixtures.faust_app", "worker", "-l", "info"]
    return Proc(args, tmp_path / f"worker-{run}.log", env=env)


def test_faust_worker_recovers_table_and_offsets_after_restart(broker, tmp_path):
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic(WORDS_TOPIC, 1, 1)])  # faust does not create source topics
    admin.close()
    out = tmp_path / "counts.txt"
    send_words(broker.bootstrap, ["a", "b", "a", "a", "b", "a", "b", "a", "a", "b"])

    worker = start_worker(broker.bootstrap, tmp_path, out, 1)
    try:
        wait_for(lambda: len(lines(out)) >= 10, 90, what="the worker to count 10 words")
        wait_for(lambda: committed_offset(broker.bootstrap) == 10, 30, what="faust to commit offset 10")
    finally:
        worker.stop(grace_s=10)
    assert len(lines(out)) == 10
    assert dict(line.split() for line in lines(out)) == {"a": "6", "b": "4"}

    send_words(broker.bootstrap, ["a", "b", "a", "b", "a"])
    worker = start_worker(broker.bootstrap, tmp_path, out, 2)
    try:
        wait_for(lambda: len(lines(out)) >= 15, 90, what="the restarted worker to count 5 more words")
    finally:
        worker.stop(grace_s=10)
    after_restart = lines(out)[10:]
    assert after_restart == ["a 7", "b 5", "a 8", "b 6", "a 9"], "table restored, nothing reprocessed"

"""Integration: `agentstream train --follow --nproc 2` publishes every policy version exactly once
while its ranks are killed.

Two gloo ranks on the embedded broker follow `training.batches`; rank 1 is killed with SIGKILL right
after v1 is announced, and rank 0 of the restarted group right after its first version. The launcher
restarts the whole group each time; at the end `policy.updates` holds v1..vN once each, with no gap,
and every batch is in exactly one version.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from schemas import topics
from schemas.codec import decode
from tests.support.processes import AGENTSTREAM, Proc, pid_gone, wait_for
from tests.support.trainer_data import publish_sft_batches

pytestmark = pytest.mark.integration

BATCHES = 6


def _read_all(bootstrap, topic):
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=1500)
    parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    events = [decode(r.value) for r in consumer]
    consumer.close()
    return events


def _rank_pid(launcher_pid: int, rank: int, not_port: str | None = None) -> tuple[int, str] | None:
    """(pid, MASTER_PORT) of the launcher's child that is `rank` (of a group not on `not_port`)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != launcher_pid:
                continue
            env = dict(
                item.split("=", 1) for item in (entry / "environ").read_text().split("\0") if "=" in item
            )
        except (OSError, IndexError, ValueError):
            continue
        if (
            env.get("RANK") == str(rank)
            and env.get("MASTER_PORT") != not_port
            and not pid_gone(int(entry.name))
        ):
            return int(entry.name), env["MASTER_PORT"]
    return None


def _versions(watcher, parts) -> int:
    return sum(watcher.end_offsets(parts).values())


def test_killing_either_rank_restarts_the_group_and_each_version_is_published_once(broker, data_dir):
    from kafka import KafkaConsumer, TopicPartition

    from clients.kafka import ensure_topics

    ensure_topics(broker.bootstrap)
    batch_ids = publish_sft_batches(broker.bootstrap, data_dir, BATCHES)
    args = ["train", "--follow", "--nproc", "2", "--bootstrap-servers", broker.bootstrap]
    args += ["--data-dir", str(data_dir), "--base-model", "tiny", "--kinds", "sft", "--idle-exit-s", "10"]
    watcher = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    parts = [
        TopicPartition(topics.POLICY_UPDATES, p) for p in watcher.partitions_for_topic(topics.POLICY_UPDATES)
    ]
    launcher = Proc([*AGENTSTREAM, *args], data_dir.parent / "launcher.log", env={"OMP_NUM_THREADS": "1"})
    try:
        wait_for(lambda: _versions(watcher, parts), timeout_s=180, interval_s=0.01, what="v1")
        rank1, port = wait_for(lambda: _rank_pid(launcher.pid, 1), timeout_s=10, what="rank 1")
        os.kill(rank1, signal.SIGKILL)
        first_kill = _versions(watcher, parts)
        assert first_kill < BATCHES, "rank 1 was killed after the last update: nothing was tested"
        wait_for(
            lambda: _versions(watcher, parts) > first_kill, timeout_s=180, interval_s=0.01, what="a version"
        )
        rank0, _ = wait_for(
            lambda: _rank_pid(launcher.pid, 0, not_port=port), timeout_s=10, what="new rank 0"
        )
        os.kill(rank0, signal.SIGKILL)
        second_kill = _versions(watcher, parts)
        assert second_kill < BATCHES, "rank 0 was killed after the last update: nothing was tested"
        code = launcher.popen.wait(timeout=300)  # --idle-exit-s: rank 0 stops rank 1, both exit 0
    finally:
        launcher.stop()
        watcher.close()
    log = launcher.log_text()
    assert code == 0, log[-4000:]
    assert "rank 1 was killed by SIGKILL" in log and "rank 0 was killed by SIGKILL" in log, log[-4000:]
    updates = _read_all(broker.bootstrap, topics.POLICY_UPDATES)
    assert [u.policy_version for u in updates] == [f"v{i}" for i in range(1, BATCHES + 1)]
    assert [u.previous_version for u in updates] == [None, *(f"v{i}" for i in range(1, BATCHES))]
    assert Counter(b for u in updates for b in u.batch_ids) == Counter(batch_ids)

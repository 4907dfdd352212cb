"""The loop on a short schedule: `up --policy --train` with rollouts in groups against the stack's
policy server. Versions advance, the server reloads each, steps recorded after a reload carry the new
version, `policy_versions` rows and `agentstream lineage` agree with the topics; kill -9 of the
executor mid-update publishes no version twice, skips none, and trains no batch twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from clients.kafka import read_to_end
from infra.stack import StackConfig
from schemas import topics
from schemas.codec import decode
from schemas.events import BatchBuilt, PolicyUpdated
from tests.support.processes import AGENTSTREAM, Proc, free_port, wait_for

TASKS = [
    {"task_id": f"calc-{i}", "env": "calc", "task": {"expression": f"{i} + {i + 1}"}} for i in range(1, 5)
]
LOOP_ENV = {  # every component reads its options from the environment; each takes the ones it has
    "AGENTSTREAM_KINDS": "grpo",
    "AGENTSTREAM_GROUP_SIZE": "4",
    "AGENTSTREAM_BATCH_TRAJECTORIES": "8",
    "AGENTSTREAM_FLUSH_INTERVAL_S": "0.5",
}
TRAIN_ARGS = "--learning-rate 1e-3 --micro-batch-size 8 --max-staleness 2"


def _cli(*args: str) -> str:
    done = subprocess.run([*AGENTSTREAM, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _serving(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
        return json.loads(reply.read())["policy_version"]


def _updates(bootstrap: str) -> list[PolicyUpdated]:
    return [
        e
        for r in read_to_end(bootstrap, [topics.POLICY_UPDATES])
        if isinstance(e := decode(r.value), PolicyUpdated)
    ]


def _batches(bootstrap: str) -> list[BatchBuilt]:
    return [
        e
        for r in read_to_end(bootstrap, [topics.TRAINING_BATCHES])
        if isinstance(e := decode(r.value), BatchBuilt)
    ]


def _start(tmp_path: Path, data_dir: Path, port: int) -> Proc:
    args = ["up", "--policy", "--policy-port", str(port), "--train", "--train-args", TRAIN_ARGS,
            "--data-dir", str(data_dir), "--broker-port", str(free_port()), "--no-console"]  # fmt: skip
    up = Proc([*AGENTSTREAM, *args], tmp_path / "up.log", env=LOOP_ENV)
    wait_for(lambda: "[up] running:" in up.log_text() or not up.alive(), timeout_s=180, what="the stack")
    assert up.alive(), up.log_text()[-3000:]
    return up


def _rollouts(tmp_path: Path, port: int, bootstrap: str) -> Proc:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    args = ["rollout", "--env", "calc", "--tasks", str(tasks), "--group-size", "4", "--concurrency", "4",
            "--max-turns", "2", "--max-tokens", "12", "--forever", "--policy-url", f"http://127.0.0.1:{port}/v1",
            "--bootstrap-servers", bootstrap, "--data-dir", str(tmp_path / "rollout")]  # fmt: skip
    return Proc([*AGENTSTREAM, *args], tmp_path / "rollout.log")


def _kill_executor_mid_update(data_dir: Path, bootstrap: str) -> None:
    """SIGKILL the executor right after a new batch appears (it is then training on it)."""
    seen = len(_batches(bootstrap))
    wait_for(lambda: len(_batches(bootstrap)) > seen, timeout_s=120, what="a new GRPO batch")
    state = json.loads((data_dir / "run" / "stack.json").read_text())
    os.kill(state["components"]["executor"]["pid"], signal.SIGKILL)


@pytest.mark.timeout(900)
def test_the_loop_advances_reloads_records_versions_and_survives_an_executor_kill9(tmp_path):
    data_dir, port = tmp_path / "stack", free_port()
    up = _start(tmp_path, data_dir, port)
    rollout = None
    try:
        state = json.loads((data_dir / "run" / "stack.json").read_text())
        bootstrap = state["bootstrap_servers"]
        config = StackConfig(data_dir, bootstrap, f"chdb://{data_dir / 'clickhouse'}")
        rollout = _rollouts(tmp_path, port, bootstrap)
        wait_for(lambda: len(_updates(bootstrap)) >= 1, timeout_s=300, what="policy v1")
        wait_for(lambda: _serving(port) != "base", timeout_s=60, what="the server to reload v1")
        _kill_executor_mid_update(data_dir, bootstrap)
        wait_for(lambda: len(_updates(bootstrap)) >= 3, timeout_s=300, what="v3 after the restart")
        wait_for(lambda: _serving(port) == _updates(bootstrap)[-1].policy_version, timeout_s=60,
                 what="the server to serve the newest version")  # fmt: skip
        rollout.stop()
        updates = _updates(bootstrap)

        # versions advance one by one, each published once, each batch trained in one version at most
        versions = [u.policy_version for u in updates]
        assert versions == [f"v{i}" for i in range(1, len(updates) + 1)], versions
        assert [u.previous_version for u in updates] == [None, *versions[:-1]]
        trained = [b for u in updates for b in u.batch_ids]
        assert len(trained) == len(set(trained)) and set(trained) <= {b.batch_id for b in _batches(bootstrap)}
        assert (
            json.loads((data_dir / "run" / "stack.json").read_text())["components"]["executor"]["restarts"]
            >= 1
        )
        for u in updates:  # ratios are positive and ESS normalised to (0, 1] (float32 sums: 1e-4)
            m = u.metrics
            assert 0 < m["is_ratio_mean"] <= m["is_ratio_max"] and 0 < m["ess"] <= 1 + 1e-4 and "kl" in m, m
            assert sum(u.staleness_histogram.values()) == u.metrics["trained_groups"]
        # v1 was trained on episodes the base sampled, from the base's weights: the policy server's
        # behaviour logprobs and the executor's must then agree token by token (ratio ~1). A token /
        # logprob misalignment, a different base or a wrong template puts the ratios far from 1.
        assert updates[0].behaviour_versions == ["base"], updates[0].behaviour_versions
        v1 = updates[0].metrics
        assert abs(v1["is_ratio_mean"] - 1) < 0.05 and v1["is_ratio_max"] < 1.5 and v1["ess"] > 0.95, v1

        # steps sampled after a reload carry the version that sampled them, never one not yet published
        published = {u.policy_version: u.occurred_at for u in updates}
        steps_sql = (
            "SELECT policy_version, min(occurred_at), count() FROM agentstream.steps FINAL "
            "WHERE trajectory_id IN (SELECT trajectory_id FROM agentstream.episodes FINAL "
            "WHERE agent = 'rollout') GROUP BY policy_version"
        )
        by_version = wait_for(
            lambda: (r := config.query(steps_sql)) and any(v in published for v, _, _ in r) and r,
            timeout_s=90, what="steps sampled by a trained version",
        )  # fmt: skip
        for version, first_at, _ in by_version:
            assert version == "base" or version in published, by_version
            if version in published:
                assert first_at.replace(tzinfo=None) >= published[version].replace(tzinfo=None), by_version

        # policy_versions rows and lineage agree with the topic
        # (the executor may still be training batches queued before the rollouts stopped: compare
        # the table with the topic as read at the same moment)
        rows_sql = (
            "SELECT policy_version, previous_version, batch_ids FROM agentstream.policy_versions FINAL "
            "ORDER BY step"
        )

        def table_matches_topic():
            topic = [(u.policy_version, u.previous_version, u.batch_ids) for u in _updates(bootstrap)]
            return [(v, p, list(b)) for v, p, b in config.query(rows_sql)] == topic

        wait_for(table_matches_topic, timeout_s=120, what="a policy_versions row per published version")
        report = json.loads(_cli("lineage", updates[1].policy_version, "--json", "--data-dir", str(data_dir)))
        assert report["version"]["previous_version"] == "v1"
        assert sorted(b["batch_id"] for b in report["batches"]) == sorted(updates[1].batch_ids)
        assert {t["trajectory_id"] for t in report["trajectories"]} == set(updates[1].trajectory_ids)
        assert report["steps"] and {s["trajectory_id"] for s in report["steps"]} == set(
            updates[1].trajectory_ids
        )
        assert set(report["steps_by_policy_version"]) <= {"base", *updates[1].behaviour_versions}
        assert set(updates[1].behaviour_versions) <= {"base", "v1"}  # sampled by base or v1, trained into v2
    finally:
        if rollout is not None:
            rollout.stop()
        up.stop()

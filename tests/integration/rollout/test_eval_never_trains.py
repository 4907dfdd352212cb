"""Evaluation never trains: a live trainer (the stream worker scoring and assembling, the batch builder
consuming `trajectory.scored`) while `agentstream eval` plays three policies on the same tasks as a
training rollout. The eval episodes are recorded and scored (purpose "eval"), the rollout's episodes
make batches, and no batch holds an eval episode although they share task ids (a GRPO group takes
every episode of its task and group; an SFT batch any solved episode that is not a content copy of an
earlier one). Then the eval's report: Holm-corrected paired tests of every pair."""

from __future__ import annotations

import json

import pytest

from clients.kafka import ensure_topics
from schemas import topics
from schemas.events import BatchBuilt, EpisodeStarted, TrajectoryScored
from tests.support.openai_stub import calc_solver, scripted_openai
from tests.support.processes import AGENTSTREAM, Proc, wait_for
from tests.support.streams_helpers import read_topic, worker_args

pytestmark = pytest.mark.integration

TASKS = [
    {"task_id": "calc-a", "env": "calc", "task": {"expression": "3 + 4"}},
    {"task_id": "calc-b", "env": "calc", "task": {"expression": "9 - 5"}},
]


def run_cli(tmp_path, name: str, *args: str) -> str:
    proc = Proc([*AGENTSTREAM, *args], tmp_path / f"{name}.log")
    try:
        wait_for(lambda: not proc.alive(), timeout_s=180, what=f"`agentstream {args[0]}` to finish")
    finally:
        proc.stop()
    text = proc.log_text()
    assert proc.popen.returncode == 0, text[-3000:]
    return text


def started(bootstrap: str, purpose: str) -> set[str]:
    events = read_topic(bootstrap, topics.AGENT_EVENTS)
    return {e.trajectory_id for e in events if isinstance(e, EpisodeStarted) and e.purpose == purpose}


def test_a_live_trainer_builds_batches_from_rollouts_and_never_from_eval_episodes(broker, tmp_path):
    ensure_topics(broker.bootstrap)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    worker = Proc(worker_args(broker.bootstrap, tmp_path / "worker", "scoring"), tmp_path / "worker.log")
    trainer_args = ["batch", "--bootstrap-servers", broker.bootstrap, "--data-dir", str(tmp_path / "trainer")]
    trainer_args += ["--kinds", "sft,grpo", "--batch-trajectories", "4", "--flush-interval-s", "0.5"]
    trainer_args += ["--group-size", "4", "--retokenize", "--log-level", "INFO"]
    trainer = Proc([*AGENTSTREAM, *trainer_args], tmp_path / "trainer.log")
    try:
        with scripted_openai(calc_solver) as (url, _requests):
            common = ["--env", "calc", "--tasks", str(tasks), "--max-turns", "3", "--max-tokens", "8"]
            common += ["--bootstrap-servers", broker.bootstrap]
            urls = [u for _ in range(3) for u in ("--policy-url", url)]
            report_file = tmp_path / "eval.json"
            report = run_cli(
                tmp_path, "eval", "eval", *common, *urls, "--episodes-per-task", "4",
                "--bootstrap-resamples", "500", "--json", str(report_file), "--data-dir", str(tmp_path / "e"),
            )  # fmt: skip
            run_cli(
                tmp_path, "rollout", "rollout", *common, "--policy-url", url, "--group-size", "4",
                "--data-dir", str(tmp_path / "r"),
            )  # fmt: skip
        evals, trains = started(broker.bootstrap, "eval"), started(broker.bootstrap, "train")
        assert len(evals) == 3 * 2 * (4 + 1) and len(trains) == 2 * 4  # 3 policies, 2 tasks, 4 + greedy

        def scored_eval():
            scored = [
                e
                for e in read_topic(broker.bootstrap, topics.TRAJECTORY_SCORED)
                if isinstance(e, TrajectoryScored)
            ]
            ids = {e.trajectory_id for e in scored if e.purpose == "eval"}
            eval_tasks = {e.task_id for e in scored if e.trajectory_id in evals}
            return ids == evals and eval_tasks == {"calc-a", "calc-b"}

        wait_for(
            scored_eval,
            timeout_s=120,
            interval_s=1.0,
            what=f"the eval episodes scored\n{worker.log_text()[-2000:]}",
        )

        def batches() -> list[BatchBuilt]:
            return [
                e for e in read_topic(broker.bootstrap, topics.TRAINING_BATCHES) if isinstance(e, BatchBuilt)
            ]

        def batched():  # both kinds: the SFT lane flushes on its own clock, after or before GRPO's
            built = batches()
            grpo = {i for e in built if e.kind == "grpo" for i in e.trajectory_ids}
            return grpo >= trains and any(e.kind == "sft" for e in built)

        try:
            wait_for(batched, timeout_s=120, interval_s=1.0, what="the rollout batched")
        except TimeoutError:
            pass  # asserted below, after the leak check (a leak can also keep the rollout out)
        built = batches()
        trainer_log = trainer.log_text()
    finally:
        trainer.stop()
        worker.stop()
    in_batches = {i for e in built for i in e.trajectory_ids}
    assert not in_batches & evals, f"eval episodes trained on: {sorted(in_batches & evals)[:5]}"
    assert {i for e in built if e.kind == "grpo" for i in e.trajectory_ids} >= trains, trainer_log[-3000:]
    assert "not for training (purpose 'eval')" in trainer_log
    assert {e.kind for e in built} == {"sft", "grpo"}
    left_out = sum(e.builder_config.get("left_out_by_purpose", 0) for e in built if e.kind == "grpo")
    assert 0 < left_out <= len(evals)

    # the eval's report: three policies (the same endpoint, so never a significant difference)
    pairs = [line for line in report.splitlines() if "[eval] difference" in line]
    assert len(pairs) == 3 and all("Holm-adjusted p = " in line for line in pairs)
    assert all("no significant difference" in line for line in pairs)
    data = json.loads(report_file.read_text())
    assert [p["greedy_episodes"] for p in data["policies"]] == [2, 2, 2]
    assert [p["successes"] for p in data["policies"]] == [8, 8, 8]  # the calc solver solves every task
    assert {c["pairs"] for c in data["pairs"]} == {8}

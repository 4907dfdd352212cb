"""`agentstream demo` (what `make demo` runs) end to end: it prints the leaderboard and the batches,
and what it shows came through the product's own loop: tasks of `producers/envs`, run by
`agentstream rollout`, with every action sampled by the policy server (token ids, logprobs, the
version it served), then the broker, the scoring workers, the sink into chDB and the trainer.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from infra.stack import StackConfig
from producers.envs.tasks import builtin_tasks
from tests.support.processes import AGENTSTREAM, Proc, descendants, hard_kill

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

EPISODES, GROUP_SIZE = 12, 2


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[str, Path]:
    root = tmp_path_factory.mktemp("demo")
    args = [*AGENTSTREAM, "demo", "--data-dir", str(root), "--episodes", str(EPISODES)]
    proc = Proc([*args, "--group-size", str(GROUP_SIZE)], root / "demo.log")
    try:
        code = proc.popen.wait(timeout=200)
    finally:
        leftover = descendants(proc.pid)
        proc.stop()
        hard_kill(leftover)
    log = proc.log_text()
    assert code == 0, f"agentstream demo exited {code}:\n{log[-4000:]}"
    return log, root / "demo"


def test_demo_prints_the_leaderboard_and_the_batches(demo):
    log, _ = demo
    assert "== Leaderboard (by model) ==" in log
    batches = log.split("== Training batches built:", 1)
    assert len(batches) == 2 and "| grpo" in batches[1], log[-3000:]
    assert "done in" in log


def test_the_episodes_are_product_env_tasks_run_by_the_rollout_command(demo):
    _, data_dir = demo
    shipped = {t.task_id for name in ("calc", "conversation") for t in builtin_tasks(name)}
    rows = _query(
        data_dir,
        "SELECT agent, policy_version, task_id, count() FROM agentstream.trajectories FINAL "
        "GROUP BY agent, policy_version, task_id",
    )
    assert sum(r[3] for r in rows) == EPISODES
    assert {r[0] for r in rows} == {"rollout"}, rows  # the recorder `agentstream rollout` opens
    assert {r[1] for r in rows} == {"base"}, rows  # the version the policy server said it served
    assert {r[2] for r in rows} <= shipped and len(rows) == EPISODES // GROUP_SIZE, rows
    assert all(r[3] == GROUP_SIZE for r in rows), rows


def test_every_step_was_sampled_by_the_policy_server(demo):
    _, data_dir = demo
    steps, sampled = _query(
        data_dir,
        "SELECT count(), countIf(sampled_tokens > 0 AND tokenizer_hash != '') FROM agentstream.steps FINAL",
    )[0]
    assert steps >= EPISODES and sampled == steps, (steps, sampled)
    assert "policy server listening" in (data_dir / "logs" / "policy.log").read_text()


def test_grpo_rows_carry_the_policy_servers_logprobs(demo):
    _, data_dir = demo
    rows = [
        json.loads(line)
        for path in sorted((data_dir / "batches" / "grpo").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert rows, "no GRPO rows were written"
    for row in rows:  # token-faithful: sampled ids and their logprobs, not re-tokenised messages
        assert row["behaviour_version"] == "base"
        assert len(row["behaviour_logprobs"]) == len(row["input_ids"]) > 0


def _query(data_dir: Path, sql: str) -> list[tuple]:
    config = StackConfig(data_dir, "unused:0", f"chdb://{data_dir / 'clickhouse'}")
    deadline = time.monotonic() + 30
    while True:
        try:
            return config.query(sql)
        except Exception:  # chDB's directory lock may outlive the sink for a moment
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)

"""`agentstream rollout` against the stack's policy server: groups of calc episodes land in ClickHouse
with their group ids, their steps and the rule rewards of those steps."""

from __future__ import annotations

import json
import subprocess

from infra.stack import StackConfig
from tests.support.processes import AGENTSTREAM, Proc, free_port, wait_for

TASKS = [
    {"task_id": "calc-a", "env": "calc", "task": {"expression": "3 + 4"}},
    {"task_id": "calc-b", "env": "calc", "task": {"expression": "9 - 5"}},
]


def test_calc_rollout_groups_land_in_clickhouse_with_rule_rewards(tmp_path):
    data_dir, port = tmp_path / "stack", free_port()
    up = Proc(
        [
            *AGENTSTREAM,
            "up",
            "--no-trainer",
            "--policy",
            "--policy-port",
            str(port),
            "--data-dir",
            str(data_dir),
            "--broker-port",
            str(free_port()),
        ],
        tmp_path / "up.log",
    )
    try:
        wait_for(lambda: "[up] running:" in up.log_text() or not up.alive(), timeout_s=180, what="the stack")
        assert up.alive(), up.log_text()[-3000:]
        state = json.loads((data_dir / "run" / "stack.json").read_text())
        tasks = tmp_path / "tasks.jsonl"
        tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
        rollout = subprocess.run(
            [
                *AGENTSTREAM,
                "rollout",
                "--env",
                "calc",
                "--tasks",
                str(tasks),
                "--group-size",
                "4",
                "--concurrency",
                "4",
                "--max-turns",
                "3",
                "--max-tokens",
                "8",
                "--policy-url",
                f"http://127.0.0.1:{port}/v1",
                "--bootstrap-servers",
                state["bootstrap_servers"],
                "--data-dir",
                str(tmp_path / "rollout"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert rollout.returncode == 0, rollout.stderr[-3000:]
        assert "[rollout] 8 episodes" in rollout.stdout

        config = StackConfig(data_dir, state["bootstrap_servers"], f"chdb://{data_dir / 'clickhouse'}")
        groups_sql = (
            "SELECT task_id, group_id, count(), countIf(success IS NOT NULL) FROM agentstream.episodes FINAL "
            "WHERE agent = 'rollout' GROUP BY task_id, group_id ORDER BY task_id"
        )
        groups = wait_for(
            lambda: (r := config.query(groups_sql)) and sum(x[3] for x in r) == 8 and r,
            timeout_s=90,
            what="8 ended episodes",
        )
        assert [(task, count) for task, _, count, _ in groups] == [("calc-a", 4), ("calc-b", 4)]
        assert all(group_id.startswith(task) for task, group_id, _, _ in groups)
        rewards_sql = (
            "SELECT count() FROM agentstream.rule_rewards FINAL WHERE trajectory_id IN "
            "(SELECT trajectory_id FROM agentstream.episodes FINAL WHERE agent = 'rollout')"
        )
        steps_sql = (
            "SELECT count() FROM agentstream.steps FINAL WHERE trajectory_id IN "
            "(SELECT trajectory_id FROM agentstream.episodes FINAL WHERE agent = 'rollout')"
        )
        steps = config.query(steps_sql)[0][0]
        assert 8 <= steps <= 24  # 1 to 3 turns per episode, each recorded once
        wait_for(
            lambda: config.query(rewards_sql)[0][0] == steps, timeout_s=90, what="a rule reward per step"
        )
    finally:
        up.stop()

"""`agentstream rollout` against the stack's policy server: groups of calc and sandbox episodes land
in ClickHouse with their group ids, their steps and the rule rewards of those steps; every built-in
coding task rolled out in the Docker sandbox lands with its verified outcome; `eval` of two policies
prints rates with intervals."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import producers.envs
from infra.stack import StackConfig
from tests.support.openai_stub import scripted_openai
from tests.support.processes import AGENTSTREAM, Proc, free_port, wait_for

BUILTIN_SANDBOX = Path(producers.envs.__file__).with_name("tasks") / "sandbox.jsonl"
TASKS = [
    {"task_id": "calc-a", "env": "calc", "task": {"expression": "3 + 4"}},
    {"task_id": "calc-b", "env": "calc", "task": {"expression": "9 - 5"}},
]
ROLLOUT_STEPS = (
    "SELECT count() FROM agentstream.{table} FINAL WHERE trajectory_id IN "
    "(SELECT trajectory_id FROM agentstream.episodes FINAL WHERE agent = 'rollout' AND domain = 'math')"
)


def fixer(patch: str):
    """A scripted policy: writes the task's reference fix, `git apply`s it, removes the patch file,
    then answers (the answer goes to `submit`, and the verdict runs)."""
    steps = [
        ("file_write", {"path": "fix.patch", "content": patch}),
        ("git", {"subcommand": "apply", "args": ["fix.patch"]}),
        ("shell", {"command": ["rm", "fix.patch"]}),
    ]

    def script(messages: list[dict]):
        done = sum(1 for m in messages if m.get("role") == "tool")
        return ("", steps[done]) if done < len(steps) else ("fixed", None)

    return script


def _cli(*args: str) -> str:
    done = subprocess.run([*AGENTSTREAM, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _up(tmp_path: Path, data_dir: Path, port: int) -> Proc:
    args = ["up", "--no-batch", "--no-console", "--policy", "--policy-port", str(port)]
    args += ["--data-dir", str(data_dir)]
    up = Proc([*AGENTSTREAM, *args, "--broker-port", str(free_port())], tmp_path / "up.log")
    wait_for(lambda: "[up] running:" in up.log_text() or not up.alive(), timeout_s=180, what="the stack")
    assert up.alive(), up.log_text()[-3000:]
    return up


@pytest.mark.engine
def test_rollouts_land_in_clickhouse_with_groups_and_rule_rewards_and_eval_compares(tmp_path, sandbox_engine):
    data_dir, port = tmp_path / "stack", free_port()
    up = _up(tmp_path, data_dir, port)
    try:
        state = json.loads((data_dir / "run" / "stack.json").read_text())
        config = StackConfig(data_dir, state["bootstrap_servers"], f"chdb://{data_dir / 'clickhouse'}")
        common = [
            "--policy-url",
            f"http://127.0.0.1:{port}/v1",
            "--bootstrap-servers",
            state["bootstrap_servers"],
        ]
        tasks = tmp_path / "tasks.jsonl"
        tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))

        # calc: 2 tasks x groups of 4
        calc = ["--env", "calc", "--tasks", str(tasks), "--group-size", "4", "--concurrency", "4"]
        out = _cli(
            "rollout",
            *calc,
            "--max-turns",
            "3",
            "--max-tokens",
            "8",
            "--data-dir",
            str(tmp_path / "r1"),
            *common,
        )
        assert "[rollout] 8 episodes" in out
        groups_sql = (
            "SELECT task_id, group_id, count(), countIf(success IS NOT NULL) FROM agentstream.episodes FINAL "
            "WHERE agent = 'rollout' AND domain = 'math' GROUP BY task_id, group_id ORDER BY task_id"
        )
        groups = wait_for(
            lambda: (r := config.query(groups_sql)) and sum(x[3] for x in r) == 8 and r,
            timeout_s=90,
            what="8 ended episodes",
        )
        assert [(task, count) for task, _, count, _ in groups] == [("calc-a", 4), ("calc-b", 4)]
        assert all(group_id.startswith(task) for task, group_id, _, _ in groups)
        steps = config.query(ROLLOUT_STEPS.format(table="steps"))[0][0]
        assert 8 <= steps <= 24  # 1 to 3 turns per episode, each recorded once
        rewards = ROLLOUT_STEPS.format(table="rule_rewards")
        wait_for(lambda: config.query(rewards)[0][0] == steps, timeout_s=90, what="a rule reward per step")

        # sandbox (coding): one built-in task in a group of 4, judged by running its tests
        sandbox_tasks = tmp_path / "sandbox.jsonl"
        sandbox_tasks.write_text(BUILTIN_SANDBOX.read_text().splitlines()[0] + "\n")
        sandbox_first_task = json.loads(BUILTIN_SANDBOX.read_text().splitlines()[0])["task_id"]
        coding_args = [
            "--env",
            "sandbox",
            "--tasks",
            str(sandbox_tasks),
            "--group-size",
            "4",
            "--max-turns",
            "2",
        ]
        out = _cli("rollout", *coding_args, "--max-tokens", "8", "--data-dir", str(tmp_path / "r2"), *common)
        assert "[rollout] 4 episodes" in out
        coding_sql = (
            "SELECT count(), uniqExact(group_id), countIf(success = 0) FROM agentstream.episodes FINAL "
            "WHERE agent = 'rollout' AND domain = 'coding' AND success IS NOT NULL"
        )
        coding = wait_for(
            lambda: (r := config.query(coding_sql)) and r[0][0] == 4 and r,
            timeout_s=90,
            what="4 coding episodes",
        )
        assert coding == [(4, 1, 4)]  # one group; the untrained model fixes nothing, and the tests say so

        # every built-in coding task, in the Docker sandbox, once: each lands with its verdict
        builtin = [json.loads(line)["task_id"] for line in BUILTIN_SANDBOX.read_text().splitlines() if line]
        docker = {
            "backend": "docker",
            "docker_host": sandbox_engine.docker_host,
            "image": sandbox_engine.image,
        }
        docker_args = ["--env", "sandbox", "--group-size", "1", "--concurrency", "4", "--max-turns", "1"]
        docker_args += [
            "--env-args",
            json.dumps(docker),
            "--max-tokens",
            "8",
            "--data-dir",
            str(tmp_path / "r3"),
        ]
        out = _cli("rollout", *docker_args, *common)
        assert f"[rollout] {len(builtin)} episodes" in out, out
        verified_sql = (
            "SELECT task_id, count(), max(success), max(position(ifNull(task, ''), 'reference_patch')) "
            "FROM agentstream.episodes FINAL WHERE agent = 'rollout' AND domain = 'coding' "
            "AND success IS NOT NULL GROUP BY task_id ORDER BY task_id"
        )
        verified = wait_for(
            lambda: (r := config.query(verified_sql)) and sum(row[1] for row in r) == 4 + len(builtin) and r,
            timeout_s=120,
            what=f"{len(builtin)} more verified coding episodes",
        )
        # one episode per task (the first task also has its 4 local ones); the untrained model fixes
        # nothing and the verdict (tests run in a fresh container) says so; the gold fix never
        # reached the recorded task
        counts = {row[0]: row[1] for row in verified}
        assert counts == {t: 5 if t == sandbox_first_task else 1 for t in builtin}, counts
        assert all(row[2] == 0 and row[3] == 0 for row in verified), verified

        # a policy that applies a task's reference fix: the Docker verdict says solved, and it lands
        fixed = json.loads(BUILTIN_SANDBOX.read_text().splitlines()[1])
        fix_task = tmp_path / "fix.jsonl"
        fix_task.write_text(json.dumps(fixed) + "\n")
        with scripted_openai(fixer(fixed["task"]["reference_patch"])) as (stub_url, _):
            fix_args = ["--env", "sandbox", "--tasks", str(fix_task), "--group-size", "1", "--max-turns", "6"]
            fix_args += ["--env-args", json.dumps(docker), "--data-dir", str(tmp_path / "r4"), "--policy-url"]
            out = _cli("rollout", *fix_args, stub_url, "--bootstrap-servers", state["bootstrap_servers"])
        assert "[rollout] 1 episodes" in out, out
        solved_sql = (
            "SELECT count() FROM agentstream.episodes FINAL WHERE agent = 'rollout' AND domain = 'coding' "
            f"AND task_id = '{fixed['task_id']}' AND success = 1"
        )
        wait_for(lambda: config.query(solved_sql)[0][0] == 1, timeout_s=60, what="the solved coding episode")

        # eval of two policies (the same endpoint twice): a rate with an interval each
        second = ["--policy-url", f"http://127.0.0.1:{port}/v1"]
        evaluate = ["--env", "calc", "--tasks", str(tasks), "--episodes-per-task", "2", "--max-tokens", "8"]
        report = _cli("eval", *evaluate, "--data-dir", str(tmp_path / "eval"), *common, *second)
        rates = [line for line in report.splitlines() if "95% Wilson CI" in line]
        assert len(rates) == 2 and all("/4 solved" in line for line in rates), report
        assert "[eval] difference" in report and "p = " in report
    finally:
        up.stop()

"""The demo's agents: `agentstream rollout`, one process per environment, on tasks shipped with
`producers/envs`, against the stack's policy server (the tiny model built from a config).

This is the path a user runs: the product's environments, the rollout driver and the policy server,
with every step recorded through the SDK with the token ids the server sampled. Nothing here decides
what an agent does; the policy does. It must not import torch (the policy server owns the model).
"""

from __future__ import annotations

import math
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from infra.runtime import agentstream_argv
from infra.terminal import output

TASK_FILES = ("calc", "conversation")
"""Built-in task files the demo samples from (`producers/envs/tasks/`): arithmetic and dialogues.
The sandbox tasks are left out: they run a test suite per step, too slow for a one-minute demo."""

MAX_TURNS, MAX_TOKENS = 3, 16  # a tiny model's reply: short keeps the demo near 30 s


@dataclass(frozen=True)
class RolloutRun:
    """One `agentstream rollout` of one environment: its arguments and the episodes it will run."""

    env: str
    args: tuple[str, ...]
    episodes: int


def demo_tasks(episodes: int, group_size: int) -> list:
    """About `episodes / group_size` built-in tasks, taken in turn from each task file, so every
    domain shows on the leaderboard (at least one task per file)."""
    import producers.envs  # noqa: F401  (registers the built-in environments)
    from producers.envs.tasks import builtin_tasks

    files = [builtin_tasks(name) for name in TASK_FILES]
    wanted = max(len(files), math.ceil(episodes / group_size))
    picked = []
    for index in range(max(len(f) for f in files)):
        picked += [f[index] for f in files if index < len(f)]
    return picked[:wanted]


def write_tasks(tasks: list, path: Path) -> Path:
    """The tasks as a JSONL task file (`agentstream rollout --tasks`)."""
    import orjson

    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"task_id": t.task_id, "env": t.env, "domain": t.domain, "task": t.task} for t in tasks]
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def plan_runs(tasks: list, task_file: Path, group_size: int, policy_url: str, bootstrap: str, data_dir: Path):
    """One rollout command per environment of `tasks` (the driver runs one env per process), each
    with its own data directory (its SDK spool)."""
    common = (
        "--tasks", str(task_file), "--group-size", str(group_size), "--concurrency", "4",
        "--max-turns", str(MAX_TURNS), "--max-tokens", str(MAX_TOKENS), "--policy-url", policy_url,
        "--bootstrap-servers", bootstrap,
    )  # fmt: skip
    envs = dict.fromkeys(t.env for t in tasks)
    return [
        RolloutRun(
            env,
            ("rollout", "--env", env, *common, "--data-dir", str(data_dir / "rollout" / env)),
            group_size * sum(t.env == env for t in tasks),
        )
        for env in envs
    ]


def run_rollouts(runs: list[RolloutRun], logs: Path, timeout_s: float = 120.0) -> tuple[int, list[str]]:
    """Run every rollout at once (each its own process, output in `logs/rollout-<env>.log`): the
    episodes they ran and the envs whose rollout failed (or outlived `timeout_s`: then killed)."""
    logs.mkdir(parents=True, exist_ok=True)
    started = []
    for run in runs:
        output.say(f"[demo] agentstream {' '.join(run.args[:4])} ... ({run.episodes} episodes)")
        log = open(logs / f"rollout-{run.env}.log", "wb")  # noqa: SIM115 - closed in _finish
        popen = subprocess.Popen(agentstream_argv(*run.args), stdout=log, stderr=log)
        started.append((run, popen, log))
    deadline = time.monotonic() + timeout_s
    ran = {run.env: _finish(run, popen, log, deadline, logs) for run, popen, log in started}
    return sum(ran.values()), [env for env, episodes in ran.items() if episodes is None]


def _finish(run: RolloutRun, popen: subprocess.Popen, log, deadline: float, logs: Path) -> int | None:
    try:
        code = popen.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        popen.kill()  # by its PID: our own child
        code = popen.wait()
    finally:
        log.close()
    text = (logs / f"rollout-{run.env}.log").read_text(errors="replace").strip().splitlines()
    if code != 0:
        output.warn(f"[demo] rollout of {run.env} exited {code}: {text[-1] if text else 'no output'}")
        return None
    output.say(f"[demo] {run.env}: {text[-1] if text else 'no output'}")
    return run.episodes

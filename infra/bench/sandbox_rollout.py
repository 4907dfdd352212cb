"""The sandbox half of `bench rollout`: what one tool call costs on each backend, and coding
episodes per second.

- Tool calls: `shell ["true"]` through one long-lived sandbox per backend (`make_sandbox`: the
  local bubblewrap namespace, the Docker container, each exec per call) against a bare
  `subprocess.run(["true"])`, interleaved call by call in one run after a few warm-up calls; p50,
  p99 and their ratios to bare, and the issue's targets on the call's p50 (local < 5 ms, Docker
  exec < 150 ms) marked met or missed.
- Coding episodes: `SandboxEnv` on the built-in coding tasks (taken in turn), each episode played by
  a scripted agent that reads a file the fix touches, runs the task's tests through `shell` (they
  must fail: exit 1), writes the task's `reference_patch` into `.git/` with `file_write` and
  `git apply`s it through `shell`, then submits; the verdict runs in a fresh sandbox of the same
  backend. Every verdict must be True and every unfixed test run must fail, else the bench stops
  with the episode's output (a bench of a broken path measures nothing). `--coding-episodes`
  episodes per concurrency level, one timed run per level (an episode takes seconds).

It must not decide which engine the docker rows use (`sandbox_backends` does) nor start one.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from infra.bench.report import median, percentile
from infra.errors import InfraError
from infra.options.env import add_option, positive_int

log = logging.getLogger(__name__)

TARGET_P50_MS = {"local": 5.0, "docker": 150.0}  # the targets for one tool call
WARMUP_CALLS = 5
PATCH_PATH = ".git/agentstream-bench-fix.patch"  # inside .git: never part of the agent's diff
TOOL_COLUMNS = ("side", "calls", "p50_ms", "p99_ms", "p50_ratio", "p99_ratio", "target_p50_ms", "target")
TOOL_COLUMNS += ("note",)
CODING_COLUMNS = ("backend", "concurrency", "episodes", "passed", "seconds", "episodes_per_s")
CODING_COLUMNS += ("episode_p50_s", "reset_p50_s", "verdict_p50_s", "note")


def add_arguments(parser) -> None:
    add_option(parser, "--sandbox-calls", type=positive_int, default=200, help="tool calls per side")
    add_option(
        parser,
        "--coding-concurrency",
        type=levels,
        default="1,4",
        help="comma-separated coding episodes run at once",
    )
    add_option(
        parser,
        "--coding-episodes",
        type=positive_int,
        default=8,
        help="coding episodes per level and backend",
    )


class BenchFailure(InfraError):
    """The measured path is broken (a verdict not True, a tool call that failed)."""


def levels(text: str) -> list[int]:
    """Concurrency levels from a comma-separated list.

    >>> levels("1, 4")
    [1, 4]
    """
    try:
        found = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        found = []
    if not found or min(found) < 1:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated whole numbers of at least 1, got {text!r}"
        )
    return found


# --- tool calls -----------------------------------------------------------------------------


def tool_call_overhead(boxes: dict[str, Any], calls: int) -> dict:
    """p50/p99 (ms) of `shell ["true"]` through each sandbox of `boxes` (backend -> sandbox) and of a
    bare `subprocess.run`, interleaved call by call; ratios to bare; targets met or missed."""
    sides: dict[str, Callable[[], None]] = {name: _shell_true(box, name) for name, box in boxes.items()}
    sides["bare"] = lambda: subprocess.run(["true"], check=True)
    durations: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(WARMUP_CALLS):
        for call in sides.values():
            call()
    for _ in range(max(1, calls)):
        for name, call in sides.items():
            started = time.perf_counter()
            call()
            durations[name].append((time.perf_counter() - started) * 1000)
    figures = {
        name: {"p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99)}
        for name, values in durations.items()
    }
    bare = figures["bare"]
    for name, side in figures.items():
        side["p50_ratio"] = side["p50_ms"] / bare["p50_ms"]
        side["p99_ratio"] = side["p99_ms"] / bare["p99_ms"]
        side["overhead_p50_ms"] = side["p50_ms"] - bare["p50_ms"]
        if name in TARGET_P50_MS:
            side["target_p50_ms"] = TARGET_P50_MS[name]
            side["target"] = "met" if side["p50_ms"] < TARGET_P50_MS[name] else "missed"
            side["isolation"] = boxes[name].isolation
            missing = side["isolation"].get("missing") or []
            side["note"] = f"NOT isolated: {', '.join(missing)}" if missing else "every isolation on"
    return {"calls": calls, "sides": figures}


def _shell_true(box, name: str) -> Callable[[], None]:
    def call() -> None:
        result = box.run("shell", {"command": ["true"]})
        if not result.ok:
            raise BenchFailure(f"{name} sandbox: shell true failed: {result.error or result.output!r:.500}")

    return call


def tool_rows(overhead: dict, unavailable: dict[str, str]) -> list[dict]:
    """The tool-call table: one row per side measured, one per backend that could not be had."""
    rows = []
    for name, side in overhead["sides"].items():
        label = "bare subprocess.run true" if name == "bare" else f"{name} sandbox shell true"
        rows.append({"side": label, "calls": overhead["calls"]} | {k: side.get(k) for k in TOOL_COLUMNS[2:]})
    for name, reason in unavailable.items():
        rows.append({"side": f"{name} sandbox shell true", "note": reason})
    return [{key: row.get(key) for key in TOOL_COLUMNS} for row in rows]


# --- coding episodes ------------------------------------------------------------------------


def coding_episodes(env_options: dict[str, Any], levels: list[int], episodes: int) -> dict:
    """Episodes/s of the scripted coding agent at each concurrency level, on the backend of
    `env_options` (`SandboxEnv`'s arguments: backend, docker_host, image)."""
    from producers.envs.tasks import builtin_tasks

    tasks = builtin_tasks("sandbox")
    backend = env_options["backend"]
    by_level = {}
    for level in levels:
        chosen = [tasks[i % len(tasks)] for i in range(episodes)]
        started = time.perf_counter()
        with ThreadPoolExecutor(level, thread_name_prefix=f"bench-coding-{backend}") as pool:
            played = list(pool.map(lambda task: play_episode(env_options, task), chosen))
        seconds = time.perf_counter() - started
        by_level[str(level)] = _level_summary(played, seconds)
        log.info(
            "bench rollout: %s coding, concurrency %d: %.3f episodes/s", backend, level, episodes / seconds
        )
    return by_level


def _level_summary(played: list[dict], seconds: float) -> dict:
    return {
        "episodes": len(played),
        "passed": sum(1 for p in played if p["verdict"] is True),
        "seconds": seconds,
        "episodes_per_s": len(played) / seconds,
        "episode_p50_s": median([p["episode_s"] for p in played]),
        "reset_p50_s": median([p["reset_s"] for p in played]),
        "verdict_p50_s": median([p["verdict_s"] for p in played]),
        "tasks": [p["task_id"] for p in played],
    }


def play_episode(env_options: dict[str, Any], task) -> dict:
    """One episode of the scripted agent (see the module docstring); raises `BenchFailure` unless the
    unfixed tests fail and the verdict on the reference fix is True."""
    from producers.envs.sandbox_env import SandboxEnv
    from producers.envs.sandbox_verdict import patch_paths, pytest_command

    fix = task.task.get("reference_patch")
    if not isinstance(fix, str) or not fix.strip():
        raise BenchFailure(f"coding task {task.task_id!r}: no reference_patch to apply")
    where = f"{env_options['backend']} coding episode on {task.task_id!r}"
    env = SandboxEnv(**env_options)
    began = time.perf_counter()
    try:
        env.reset(task=task.reset_task)
        reset_s = time.perf_counter() - began
        _step(env, where, "file_read", {"path": sorted(patch_paths(fix))[0]})
        ids = [*task.task.get("FAIL_TO_PASS", []), *task.task.get("PASS_TO_PASS", [])]
        unfixed = env.step({"tool": "shell", "params": {"command": pytest_command(ids)}})
        if unfixed.info.get("exit_code") != 1:
            raise BenchFailure(f"{where}: the unfixed tests should fail (exit 1): {_said(unfixed)}")
        _step(env, where, "file_write", {"path": PATCH_PATH, "content": fix})
        _step(env, where, "shell", {"command": ["git", "apply", "--whitespace=nowarn", PATCH_PATH]})
        submitted = time.perf_counter()
        final = env.step({"tool": "submit", "params": {"answer": "applied the fix"}})
        verdict_s = time.perf_counter() - submitted
    finally:
        env.close()
    if final.info.get("tests_passed") is not True:
        raise BenchFailure(f"{where}: the verdict on the reference fix is {final.info.get('tests_passed')!r}")
    episode_s = time.perf_counter() - began
    return {
        "task_id": task.task_id,
        "verdict": True,
        "episode_s": episode_s,
        "reset_s": reset_s,
        "verdict_s": verdict_s,
    }


def _step(env, where: str, tool: str, params: dict) -> None:
    ts = env.step({"tool": tool, "params": params})
    if ts.info.get("exit_code") != 0 or ts.info.get("timed_out"):
        raise BenchFailure(f"{where}: {tool} failed: {_said(ts)}")


def _said(ts) -> str:
    return f"exit {ts.info.get('exit_code')}: {str(ts.observation)[-800:]!r}"


def coding_rows(coding: dict[str, dict], unavailable: dict[str, str]) -> list[dict]:
    """The coding table: one row per backend and level, one per backend that could not be had."""
    rows = []
    for backend, levels in coding.items():
        for level, figures in levels.items():
            rows.append({"backend": backend, "concurrency": int(level)} | figures)
    for backend, reason in unavailable.items():
        rows.append({"backend": backend, "note": reason})
    return [{key: row.get(key) for key in CODING_COLUMNS} for row in rows]

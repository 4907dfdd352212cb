"""`agentstream bench rollout`: episodes/s and steps/s of the rollout driver on `calc` at several
concurrencies, and what the local sandbox adds to one tool call.

Setup (as `bench policy`): the tiny model on CPU behind one `PolicyService` (not recording: the
driver records every step through the SDK), served by the real aiohttp app on 127.0.0.1:0 in a
background event loop of this process; an embedded broker (a child process stopped by PID) takes
the recorded events. Per level, the driver's `run()` plays the built-in calc tasks `--group-size`
times each with `concurrency` episodes at once, recording into the broker (flushed to
acknowledgement inside the timing).

- rollout rows: episodes/s and steps/s (medians over repeats), turns per episode, solved share.
- sandbox rows: `LocalSandbox.run("shell", {"command": ["true"]})` against a bare
  `subprocess.run(["true"])`, interleaved call by call in one run; p50/p99 and the ratio of p50s.
"""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

from infra.bench.children import scratch_broker
from infra.bench.report import median, percentile
from infra.options.env import add_option

log = logging.getLogger(__name__)

COLUMNS = ("case", "concurrency", "episodes", "steps", "episodes_per_s", "steps_per_s")
COLUMNS += ("turns_per_episode", "solved", "p50_ms", "p99_ms", "ratio")


def add_arguments(parser) -> None:
    add_option(parser, "--concurrency", default="1,8,32", help="comma-separated episodes run at once")
    add_option(
        parser, "--group-size", type=int, default=8, help="rollouts per calc task per level and repeat"
    )
    add_option(parser, "--max-turns", type=int, default=4, help="interaction turns per episode")
    add_option(parser, "--max-tokens", type=int, default=16, help="tokens per policy reply")
    add_option(parser, "--sandbox-calls", type=int, default=200, help="tool calls per side (sandbox, bare)")


def _row(case: str, **values) -> dict:
    return {key: values.get(key) for key in COLUMNS} | {"case": case}


def run(args) -> dict:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    for name in ("httpx", "httpx2"):  # one INFO line per policy call would drown the table
        logging.getLogger(name).setLevel(logging.WARNING)
    levels = [int(x) for x in str(args.concurrency).split(",") if x.strip()]
    with scratch_broker("rollout") as (root, broker):
        rollout = _measure_rollouts(root, broker.address, levels, args)
    sandbox = sandbox_overhead(args.sandbox_calls)
    return {
        "rows": [*rollout["rows"], *sandbox.pop("rows")], "levels": levels, "rollout": rollout["summary"],
        "sandbox": sandbox, "repeats": max(1, args.repeats),
        "notes": [
            f"calc built-in tasks x {args.group_size} per level, tiny model on CPU, {args.max_tokens} "
            f"max_tokens, {args.max_turns} max turns, temperature 1; medians over {max(1, args.repeats)} "
            "repeats; every step recorded to the embedded broker (flushed inside the timing)",
            f"sandbox: namespaces {sandbox['isolation'].get('namespaces')}, run as uid "
            f"{sandbox['isolation'].get('run_as_uid')}; ratio = sandbox p50 / bare subprocess p50 "
            f"= {sandbox['ratio_p50']:.2f}x",
        ],
    }  # fmt: skip


def _measure_rollouts(root: Path, bootstrap: str, levels: list[int], args) -> dict:
    import producers.envs  # noqa: F401  (registers the built-in environments)
    from consumers.tiny_model import tiny_model_dir
    from infra.bench.policy.servers import policy_servers
    from producers.envs.tasks import builtin_tasks
    from producers.policy.engine.local import LocalEngine
    from producers.policy.service import PolicyService
    from producers.sdk.recorder import AgentRecorder

    engine = LocalEngine(tiny_model_dir(root / "data"), device="cpu")
    recorder = AgentRecorder(bootstrap, root / "spool", agent="bench-rollout", model=engine.model_name)
    tasks = builtin_tasks("calc")
    try:
        with policy_servers({"policy": PolicyService(engine, None)}, 1) as urls:
            url = f"{urls['policy']}/v1"
            _timed_run(url, tasks, recorder, max(levels), args)  # warm-up (lazy init in torch, recorder)
            runs = {level: [] for level in levels}
            for repeat in range(max(1, args.repeats)):
                for level in levels:
                    runs[level].append(_timed_run(url, tasks, recorder, level, args))
                    log.info("bench rollout: repeat %d, concurrency %d: %.2f episodes/s",
                             repeat + 1, level, runs[level][-1]["episodes_per_s"])  # fmt: skip
    finally:
        recorder.close(timeout=30)
    rows = [_rollout_row(level, results) for level, results in runs.items()]
    summary = {
        str(row["concurrency"]): {k: row[k] for k in ("episodes_per_s", "steps_per_s")} for row in rows
    }
    return {"rows": rows, "summary": summary}


def _timed_run(url: str, tasks: list, recorder, level: int, args) -> dict:
    from producers.rollout.driver import RolloutConfig
    from producers.rollout.driver import run as run_rollouts

    config = RolloutConfig(
        env="calc", policy_url=url, group_size=args.group_size, concurrency=level,
        max_turns=args.max_turns, max_tokens=args.max_tokens,
    )  # fmt: skip
    started = time.perf_counter()
    results = run_rollouts(config, tasks, recorder)
    if not recorder.flush(120):
        raise RuntimeError(f"recorder: {recorder.pending} steps not acknowledged by the broker after 120 s")
    seconds = time.perf_counter() - started
    steps = sum(r.turns for r in results)
    return {
        "episodes": len(results), "steps": steps, "solved": sum(r.success for r in results),
        "episodes_per_s": len(results) / seconds, "steps_per_s": steps / seconds,
    }  # fmt: skip


def _rollout_row(level: int, results: list[dict]) -> dict:
    episodes = results[0]["episodes"]
    steps = sum(r["steps"] for r in results)
    return _row(
        "rollout calc", concurrency=level, episodes=episodes, steps=results[0]["steps"],
        episodes_per_s=median([r["episodes_per_s"] for r in results]),
        steps_per_s=median([r["steps_per_s"] for r in results]),
        turns_per_episode=steps / (episodes * len(results)),
        solved=sum(r["solved"] for r in results) / (episodes * len(results)),
    )  # fmt: skip


def sandbox_overhead(calls: int) -> dict:
    """p50/p99 (ms) of a `true` through `LocalSandbox.run("shell")` and of a bare `subprocess.run`,
    interleaved call by call (after a few warm-up calls each), and the ratio of the p50s."""
    from producers.sandbox.local import LocalSandbox

    durations: dict[str, list[float]] = {"sandbox": [], "bare": []}
    box = LocalSandbox()  # its own temp root: the unprivileged uid must be able to reach it
    sides = {
        "sandbox": lambda: box.run("shell", {"command": ["true"]}),
        "bare": lambda: subprocess.run(["true"], check=True),
    }
    try:
        for _ in range(5):  # warm-up
            for call in sides.values():
                call()
        for _ in range(max(1, calls)):
            for name, call in sides.items():
                started = time.perf_counter()
                call()
                durations[name].append((time.perf_counter() - started) * 1000)
        isolation = box.isolation
    finally:
        box.close()
    return _sandbox_summary(durations, calls, isolation)


def _sandbox_summary(durations: dict[str, list[float]], calls: int, isolation) -> dict:
    p50 = {name: percentile(values, 50) for name, values in durations.items()}
    p99 = {name: percentile(values, 99) for name, values in durations.items()}
    ratio = p50["sandbox"] / p50["bare"] if p50["bare"] else float("nan")
    rows = [
        _row("sandbox: LocalSandbox shell true", p50_ms=p50["sandbox"], p99_ms=p99["sandbox"], ratio=ratio),
        _row("sandbox: bare subprocess.run true", p50_ms=p50["bare"], p99_ms=p99["bare"], ratio=1.0),
    ]
    for row in rows:
        row["steps"] = calls
    return {
        "calls": calls, "p50_ms": p50, "p99_ms": p99, "ratio_p50": ratio,
        "overhead_p50_ms": p50["sandbox"] - p50["bare"], "isolation": isolation, "rows": rows,
    }  # fmt: skip

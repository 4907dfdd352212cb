"""`agentstream bench rollout`: episodes/s and steps/s of the rollout driver on `calc` at several
concurrencies; then the sandboxes: one tool call's cost on the local and the Docker backend against
a bare `subprocess.run`, coding episodes/s per backend and concurrency, and the Docker engine's
cold and warm set-up (`sandbox_rollout`, `sandbox_backends`).

Calc setup (as `bench policy`): the tiny model on CPU behind one `PolicyService` (not recording:
the driver records every step through the SDK), served by the real aiohttp app on 127.0.0.1:0 in a
background event loop of this process; an embedded broker (a child process stopped by PID) takes
the recorded events. Per level, the driver's `run()` plays the built-in calc tasks `--group-size`
times each with `concurrency` episodes at once, recording into the broker (flushed to
acknowledgement inside the timing). Rows: episodes/s and steps/s (medians over repeats), turns per
episode, solved share. `--no-calc` leaves them out.

The sandbox figures come as three further tables (tool calls, coding episodes, set-up); a backend
that cannot be had has rows that say why, and the others still run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path

from infra.bench import sandbox_backends, sandbox_rollout
from infra.bench.children import scratch_broker
from infra.bench.report import median
from infra.options.env import add_option

log = logging.getLogger(__name__)

COLUMNS = ("case", "concurrency", "episodes", "steps", "episodes_per_s", "steps_per_s")
COLUMNS += ("turns_per_episode", "solved")
TABLES = {
    "Sandbox tool call: shell true, one long-lived sandbox per backend, vs a bare subprocess.run (ms)": (
        "tool_call_rows"
    ),
    "Coding episodes (SandboxEnv, scripted agent applying the reference fix; verdict in a fresh sandbox)": (
        "coding_rows"
    ),
    "Docker engine and sandbox image set-up (s)": "setup_rows",
}


def add_arguments(parser) -> None:
    add_option(parser, "--calc", action="store_true", default=True, help="measure the calc rollouts")
    add_option(parser, "--concurrency", default="1,8,32", help="comma-separated calc episodes run at once")
    add_option(
        parser, "--group-size", type=int, default=8, help="rollouts per calc task per level and repeat"
    )
    add_option(parser, "--max-turns", type=int, default=4, help="interaction turns per calc episode")
    add_option(parser, "--max-tokens", type=int, default=16, help="tokens per policy reply")
    sandbox_rollout.add_arguments(parser)
    sandbox_backends.add_arguments(parser)


def _row(case: str, **values) -> dict:
    return {key: values.get(key) for key in COLUMNS} | {"case": case}


def run(args) -> dict:
    levels = [int(x) for x in str(args.concurrency).split(",") if x.strip()]
    rollout = _calc(args, levels) if args.calc else {"rows": [], "summary": {}}
    sandbox = measure_sandboxes(args)
    notes = [
        f"calc built-in tasks x {args.group_size} per level, tiny model on CPU, {args.max_tokens} "
        f"max_tokens, {args.max_turns} max turns, temperature 1; medians over {max(1, args.repeats)} "
        "repeats; every step recorded to the embedded broker (flushed inside the timing)"
    ] if args.calc else []  # fmt: skip
    return {
        "rows": rollout["rows"], "levels": levels if args.calc else [], "rollout": rollout["summary"],
        "sandbox": sandbox.pop("figures"), "repeats": max(1, args.repeats), "tables": TABLES,
        **sandbox, "notes": [*notes, *_sandbox_notes(args)],
    }  # fmt: skip


def _calc(args, levels: list[int]) -> dict:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    for name in ("httpx", "httpx2"):  # one INFO line per policy call would drown the table
        logging.getLogger(name).setLevel(logging.WARNING)
    with scratch_broker("rollout") as (root, broker):
        return _measure_rollouts(root, broker.address, levels, args)


def measure_sandboxes(args) -> dict:
    """Tool calls, coding episodes and set-up on every backend of `--backends` (see the docstring)."""
    from producers.sandbox.choice import make_sandbox
    from producers.sandbox.errors import SandboxError

    backends = args.backends
    with sandbox_backends.docker_target(args, "docker" in backends) as docker:
        makers = {
            "local": lambda: make_sandbox("local"),
            "docker": lambda: make_sandbox("docker", docker=docker.config),
        }
        unavailable = (
            {}
            if docker.config is not None or "docker" not in backends
            else {"docker": f"unavailable: {docker.unavailable}"}
        )
        boxes = {}
        try:
            for name in (b for b in backends if b not in unavailable):
                try:
                    boxes[name] = makers[name]()
                except SandboxError as exc:
                    unavailable[name] = f"unavailable: {exc}"
            overhead = sandbox_rollout.tool_call_overhead(boxes, args.sandbox_calls)
        finally:
            for box in boxes.values():
                box.close()
        options = {"local": {"backend": "local"}, "docker": {"backend": "docker"}}
        if docker.config is not None:
            options["docker"] |= {"docker_host": docker.config.docker_host, "image": docker.config.image}
        coding = {
            name: sandbox_rollout.coding_episodes(
                options[name], args.coding_concurrency, args.coding_episodes
            )
            for name in backends
            if name not in unavailable
        }
    config = None if docker.config is None else asdict(docker.config)
    figures = {
        "backends": backends, "tool_calls": overhead, "coding": coding, "setup": docker.setup,
        "unavailable": unavailable, "docker": {"source": docker.source, "config": config},
    }  # fmt: skip
    return {
        "figures": figures,
        "tool_call_rows": sandbox_rollout.tool_rows(overhead, unavailable),
        "coding_rows": sandbox_rollout.coding_rows(coding, unavailable),
        "setup_rows": sandbox_backends.setup_rows(docker.setup),
    }


def _sandbox_notes(args) -> list[str]:
    return [
        f"tool calls: {args.sandbox_calls} per side, interleaved call by call after "
        f"{sandbox_rollout.WARMUP_CALLS} warm-up calls; ratio = side / bare; target judged on the "
        "call's p50 (local < 5 ms, Docker exec < 150 ms)",
        f"coding: {args.coding_episodes} episodes per level and backend (built-in tasks in turn), one "
        "timed run per level; every verdict True (else the bench fails)",
    ]


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

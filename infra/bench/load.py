"""Load generation for end-to-end runs: scripted agents acting in the product's environments
(infra/bench/scripted.py), recorded through the env recorder and the real SDK at an offered rate of
steps per second, from several processes. Used by `bench e2e`.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass
from pathlib import Path

from infra.bench import scripted


@dataclass(frozen=True)
class LoadSpec:
    bootstrap_servers: str
    data_dir: Path
    steps_per_s: float
    duration_s: float
    label: str = "load"
    observation_bytes: int = 2048
    processes: int = 2
    group_size: int = 4


def drive(spec: LoadSpec) -> dict:
    """Run the load in `spec.processes` processes; returns totals (steps and episodes acknowledged)."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(spec.processes) as pool:
        results = pool.map(_drive_one, [(spec, i) for i in range(spec.processes)])
    return {
        "steps": sum(r["steps"] for r in results),
        "episodes": sum(r["episodes"] for r in results),
        "trajectory_ids": [t for r in results for t in r["trajectory_ids"]],
        "elapsed_s": max(r["elapsed_s"] for r in results),
        "delivered": all(r["delivered"] for r in results),
        "cpu_s": sum(r["cpu_s"] for r in results),
    }


def _drive_one(job: tuple[LoadSpec, int]) -> dict:
    from producers.sdk.recorder import AgentRecorder

    spec, worker = job
    rate = spec.steps_per_s / spec.processes
    padding = "." * spec.observation_bytes
    recorders = {
        p.model: AgentRecorder(
            bootstrap_servers=spec.bootstrap_servers,
            data_dir=spec.data_dir / f"load-{spec.label}-{worker}-{p.model}",
            agent=p.agent,
            model=p.model,
            policy_version="v0",
        )
        for p in scripted.POLICIES
    }
    steps = episodes = 0
    trajectory_ids = []
    start, start_cpu = time.monotonic(), time.process_time()
    round_ = 0
    while time.monotonic() - start < spec.duration_s:
        for task in scripted.tasks(3):
            for policy in scripted.POLICIES:
                group_id = f"{spec.label}-{worker}-{round_}-{task.task_id}-{policy.model}"
                for r in range(spec.group_size):
                    tid = f"{group_id}-{r}"
                    played = scripted.play(
                        recorders[policy.model], task, policy, r + round_, group_id, tid, padding
                    )
                    trajectory_ids.append(tid)
                    steps += played.steps
                    episodes += 1
                    _pace(start, steps, rate)
        round_ += 1
    delivered = all(rec.flush(timeout=120) for rec in recorders.values())
    for rec in recorders.values():
        rec.close()
    return {
        "steps": steps,
        "episodes": episodes,
        "trajectory_ids": trajectory_ids,
        "elapsed_s": time.monotonic() - start,
        "delivered": delivered,
        "cpu_s": time.process_time() - start_cpu,  # this agent process's CPU: the SDK's cost, all threads
    }


def _pace(start: float, steps: int, rate: float) -> None:
    ahead = steps / rate - (time.monotonic() - start)
    if ahead > 0:
        time.sleep(ahead)

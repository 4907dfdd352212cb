"""`agentstream bench e2e`: sustained load from scripted agents through every stage of a real embedded
stack (broker, stream worker, sink, trainer as supervised processes), then end-to-end latencies from
step publish to (a) its rule reward in ClickHouse, (b) its trajectory in ClickHouse, (c) its presence
in a training batch, as p50/p95/p99, per offered rate; plus per-stage throughput and a PNG plot.

Timestamps: a step's publish time is its `occurred_at` (set by the SDK when `step()` is called);
"in ClickHouse" is the sink's `ingested_at` of the derived event; "in a batch" is the `occurred_at` of
the `batch.built` event listing the trajectory. All on one machine, so one clock.

CPU: for each rate, the CPU seconds per 1,000 steps of every stack process and of the load
generators (the agents, recording through the SDK), from the processes' own accounting
(`infra.bench.cpu`), counted from the start of the load until everything reached ClickHouse. That
figure is stable on a shared machine where the latencies are not.

`--repeats N` runs each rate N times on the one started stack: each process's CPU figure is then its
median over the runs (`stack per run` lists every run's sum), the latency percentiles are over the
samples of all runs, and a rate counts as sustained only when every run drained.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from infra.options.env import add_option
from infra.terminal.output import say
from streams.config import DEFAULT_ROLES


def add_arguments(parser) -> None:
    parser.add_argument("--rates", default="1000", help="offered steps/s, comma-separated (one run each)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load per rate")
    parser.add_argument("--processes", type=int, default=2, help="load-generating processes")
    parser.add_argument("--drain-timeout", type=float, default=120.0, help="max seconds to wait for catch-up")
    parser.add_argument("--plot", default="bench-results/e2e.png", help="latency distribution PNG")
    add_option(parser, "--keep-data", action="store_true", help="keep the stack's data directory")
    parser.add_argument(
        "--roles",
        default=",".join(DEFAULT_ROLES),
        help="the stack's stream roles, as `up --roles` (scoring)",
    )
    parser.add_argument("--workers", type=int, default=1, help="processes per stream role, as `up --workers`")
    parser.add_argument(
        "--idle",
        type=float,
        default=10.0,
        help="first measure the started stack with no load for this many seconds (0: skip)",
    )
    for action in parser._actions:  # the common --repeats: here, runs per rate
        if action.dest == "repeats":
            action.default = 1
            action.help = (
                "runs per rate on the one started stack; CPU figures are each process's median, latency "
                "percentiles are over every run's samples [env AGENTSTREAM_REPEATS; default 1]"
            )


def run(args) -> dict:
    from infra.stack import StackSupervisor, embedded_config, stack_roles

    roles = stack_roles(args.roles)
    data_dir = Path(tempfile.mkdtemp(prefix="agentstream-e2e-"))
    config = embedded_config(data_dir, roles=roles, workers=args.workers)
    supervisor = StackSupervisor(config, on_event=lambda m: say(f"[e2e] {m}"))
    supervisor.start()
    levels, cpu_rows, samples, idle = [], [], {}, None
    repeats = args.repeats  # at least 1: the parser refuses less (infra.options.env.positive_int)
    try:
        _wait_for_clickhouse(config)
        if args.idle > 0:
            idle = _idle_cpu(supervisor, args.idle)
        for rate in [float(r) for r in str(args.rates).split(",") if r.strip()]:
            runs = [_run_level(config, supervisor, rate, args, (i + 1, repeats)) for i in range(repeats)]
            level, cpu, latencies = combine_runs(rate, runs)
            levels.append(level)
            cpu_rows.append(cpu)
            samples[f"{rate:.0f}"] = latencies
    finally:
        supervisor.stop()
        if not args.keep_data:
            shutil.rmtree(data_dir, ignore_errors=True)
    _plot(samples, args.plot)
    return {
        "rows": levels,
        "tables": {
            "CPU seconds per 1,000 steps, per process (load start .. all in ClickHouse)": "cpu_s_per_1k_steps"
        },
        "cpu_s_per_1k_steps": cpu_rows,
        "idle_cpu_ms_per_s": idle,
        "stack": {"roles": list(roles), "workers": args.workers},
        "repeats": repeats,
        "plot": args.plot,
        "data_dir": str(data_dir) if args.keep_data else None,
    }


def _stack_pids(supervisor) -> dict[str, int]:
    return {
        name: entry.popen.pid
        for name, entry in supervisor.running.items()
        if entry.popen is not None and entry.popen.poll() is None
    }


def _idle_cpu(supervisor, seconds: float, settle_s: float = 15.0) -> dict:
    """CPU milliseconds per second of every stack process with no load (after `settle_s` for the
    start-up to finish: with 5 s the sink's chDB was still busy, 39 against 15-19 ms a second):
    what the stack costs while nothing happens, i.e. polls and timers."""
    from infra.bench import cpu

    say(f"[e2e] measuring the idle stack for {seconds:.0f}s")
    time.sleep(settle_s)
    pids = _stack_pids(supervisor)
    before = cpu.snapshot(pids)
    time.sleep(seconds)
    # CPU seconds per 1,000 ms of wall clock = CPU ms per second
    per_s = cpu.per_thousand(before, cpu.snapshot(pids), round(seconds * 1000))
    row: dict = {"seconds": seconds}
    row.update({name: None if v is None else round(v * 1000, 1) for name, v in per_s.items()})
    complete = None not in per_s.values()
    row["stack"] = round(sum(v for v in per_s.values() if v is not None) * 1000, 1) if complete else None
    say("[e2e] idle CPU, ms per second: " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "seconds"))
    return row


def _run_level(config, supervisor, rate: float, args, run: tuple[int, int]) -> tuple[dict, dict, dict]:
    """Run `run[0]` of `run[1]` at `rate`: (what the load did, CPU row, latency samples by stage)."""
    from infra.bench import cpu
    from infra.bench.load import LoadSpec, drive

    label = f"r{int(rate)}-{int(time.time() * 1000)}"  # unique per run: repeats of a rate follow closely
    of = f", run {run[0]} of {run[1]}" if run[1] > 1 else ""
    say(f"[e2e] offering {rate:.0f} steps/s for {args.duration:.0f}s ({label}{of})")
    cpu_before = cpu.snapshot(_stack_pids(supervisor))
    load = drive(
        LoadSpec(
            config.bootstrap_servers,
            config.data_dir,
            rate,
            args.duration,
            label=label,
            processes=args.processes,
        )
    )
    load_end = time.monotonic()
    drained = _wait_drained(config, supervisor, label, load["episodes"], args.drain_timeout)
    drain_s = time.monotonic() - load_end
    stack_cpu = cpu.per_thousand(cpu_before, cpu.snapshot(_stack_pids(supervisor)), load["steps"])
    measured = {
        "achieved": load["steps"] / load["elapsed_s"],
        "steps": load["steps"],
        "episodes": load["episodes"],
        "drain_s": drain_s,
        "drained": drained,
    }
    return measured, _cpu_row(rate, stack_cpu, load), _latencies(config, label)


def combine_runs(rate: float, runs: list[tuple[dict, dict, dict]]) -> tuple[dict, dict, dict]:
    """One rate's table row, CPU row and pooled latency samples from its runs (pure): achieved rate
    and CPU figures are medians, steps and episodes sums, the drain the longest, percentiles over
    every run's samples; sustained when every run drained and the combined figures hold."""
    from infra.bench.report import median

    loads = [load for load, _, _ in runs]
    achieved = median([load["achieved"] for load in loads])
    row = {
        "offered steps/s": rate,
        "achieved steps/s": round(achieved, 1),
        "steps": sum(load["steps"] for load in loads),
        "episodes": sum(load["episodes"] for load in loads),
        "drain s": round(max(load["drain_s"] for load in loads), 1),
        "all in CH": all(load["drained"] for load in loads),
    }
    latencies = {
        stage: [value for _, _, samples in runs for value in samples.get(stage, [])]
        for stage in ("rule", "trajectory", "batch")
    }
    for name, values in latencies.items():
        row.update(_percentiles(name, values))
    row["sustained"] = row["all in CH"] and achieved >= 0.95 * rate and row.get("rule p99 ms", 1e9) < 2000
    if len(runs) > 1:
        row["runs"] = len(runs)
    return row, _median_cpu_row([cpu_row for _, cpu_row, _ in runs]), latencies


def _median_cpu_row(rows: list[dict]) -> dict:
    """Each figure's median over the runs (None when a run lacks it); `stack per run` beside it."""
    from infra.bench.report import median

    if len(rows) == 1:
        return rows[0]
    out: dict = {"offered steps/s": rows[0]["offered steps/s"]}
    for name in [key for key in rows[0] if key != "offered steps/s"]:
        values = [row.get(name) for row in rows]
        out[name] = None if None in values else round(median(values), 4)
    out["stack per run"] = [row.get("stack") for row in rows]
    return out


def _cpu_row(rate: float, stack: dict[str, float | None], load: dict) -> dict:
    """One run's CPU seconds per 1,000 steps: each stack process, their sum, and the agents' (SDK)."""
    measured = [v for v in stack.values() if v is not None]
    row: dict = {"offered steps/s": rate}
    row.update(stack)
    row["stack"] = round(sum(measured), 4) if len(measured) == len(stack) else None
    row["agents (SDK)"] = round(load["cpu_s"] * 1000 / load["steps"], 4) if load["steps"] else None
    return row


def _percentiles(name: str, values: list[float]) -> dict:
    from infra.bench.report import percentile

    return {f"{name} p{q} ms": round(percentile(values, q), 1) for q in (50, 95, 99)}


def _wait_for_clickhouse(config, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            config.query("SELECT count() FROM agentstream.events")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _wait_drained(config, supervisor, label: str, episodes: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    sql = (
        "SELECT uniqExact(trajectory_id) FROM agentstream.events "
        f"WHERE type = 'trajectory.scored' AND startsWith(trajectory_id, '{label}-')"
    )
    while time.monotonic() < deadline:
        supervisor.poll()
        if config.query(sql)[0][0] >= episodes:
            return True
        time.sleep(0.5)
    return False


def _latencies(config, label: str) -> dict[str, list[float]]:
    prefix = f"startsWith(s.trajectory_id, '{label}-')"
    rule = config.query(
        "SELECT toUnixTimestamp64Milli(min(r.ingested_at)) - toUnixTimestamp64Milli(any(s.occurred_at)) "
        "FROM agentstream.events AS r INNER JOIN agentstream.events AS s "
        "ON JSONExtractString(r.raw, 'source_event_id') = s.event_id "
        f"WHERE r.type = 'reward.rule.step' AND s.type = 'step.recorded' AND {prefix} GROUP BY s.event_id",
    )
    trajectory = config.query(
        "SELECT toUnixTimestamp64Milli(min(t.ingested_at)) - toUnixTimestamp64Milli(any(s.occurred_at)) "
        "FROM agentstream.events AS t INNER JOIN agentstream.events AS s "
        "ON t.trajectory_id = s.trajectory_id "
        f"WHERE t.type = 'trajectory.scored' AND s.type = 'episode.ended' AND {prefix} "
        "GROUP BY s.trajectory_id",
    )
    batch = config.query(
        "SELECT toUnixTimestamp64Milli(min(b.occurred_at)) - toUnixTimestamp64Milli(any(s.occurred_at)) "
        "FROM (SELECT occurred_at, arrayJoin(JSONExtract(raw, 'trajectory_ids', 'Array(String)')) AS tid "
        "      FROM agentstream.events WHERE type = 'batch.built') AS b "
        "INNER JOIN agentstream.events AS s ON b.tid = s.trajectory_id "
        f"WHERE s.type = 'episode.ended' AND {prefix} GROUP BY s.trajectory_id",
    )
    return {
        "rule": [float(r[0]) for r in rule],
        "trajectory": [float(r[0]) for r in trajectory],
        "batch": [float(r[0]) for r in batch],
    }


def _plot(samples: dict[str, dict[str, list[float]]], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, stage in zip(axes, ("rule", "trajectory", "batch"), strict=True):
        for rate, latencies in samples.items():
            values = sorted(latencies.get(stage, []))
            if values:
                ax.plot(values, [i / len(values) for i in range(len(values))], label=f"{rate} steps/s")
        ax.set_title(f"publish → {stage} (ms)")
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("CDF")
        ax.legend()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

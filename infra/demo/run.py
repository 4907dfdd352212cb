"""`agentstream demo`: the product's own loop on a freshly started embedded stack. The stack runs
the broker, the stream processors, the sink into chDB, the trainer and the policy server (a tiny
model built from a config); `agentstream rollout` runs built-in tasks of `producers/envs` against
it (infra/demo/rollouts.py). Then the leaderboard, reward by step, the DLQ count and the training
batches built are printed.

This is the I/O shell around infra.stack (which runs the components) and the rollout command.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from infra.terminal import output


def demo_command(args) -> int:
    from infra.demo.rollouts import demo_tasks, plan_runs, run_rollouts, write_tasks
    from infra.stack import StackSupervisor, embedded_config, free_port
    from schemas.settings import Settings

    started = time.monotonic()
    settings = Settings.from_args(args)
    data_dir = (Path(settings.data_dir) / "demo").resolve()
    if data_dir.exists() and not args.keep:
        shutil.rmtree(data_dir)
    # The demo's GRPO groups are `group_size` rollouts of one task; the batch builder flushes every 2 s.
    # The policy server records token ids with every step, so GRPO rows are token-faithful.
    batch_args = ("--group-size", str(args.group_size), "--flush-interval-s", "2")
    config = embedded_config(data_dir, batch_args=batch_args, policy=True, policy_port=free_port())
    supervisor = StackSupervisor(config, on_event=lambda message: output.say(f"[demo] {message}"))
    output.say(f"[demo] starting the embedded stack in {data_dir} (broker on {config.bootstrap_servers})")
    supervisor.start()
    try:
        tasks = demo_tasks(args.episodes, args.group_size)
        policy_url = f"http://127.0.0.1:{config.policy_port}/v1"
        runs = plan_runs(
            tasks,
            write_tasks(tasks, data_dir / "tasks.jsonl"),
            args.group_size,
            policy_url,
            config.bootstrap_servers,
            data_dir,
        )
        episodes, failed = run_rollouts(runs, data_dir / "logs")
        wait_for_pipeline(config, episodes, supervisor)
        print_results(config, data_dir)
    finally:
        output.say("[demo] stopping the stack")
        supervisor.stop()
    output.say(f"[demo] done in {time.monotonic() - started:.0f}s; data kept in {data_dir}")
    output.say(f"[demo] browse it in the web console: agentstream console --data-dir {data_dir}")
    if failed:
        output.warn(f"[demo] the rollout of {', '.join(failed)} failed: see {data_dir / 'logs'}")
    return 1 if failed else 0


def wait_for_pipeline(config, expected: int, supervisor, timeout_s: float = 90.0) -> None:
    """Wait until every trajectory is scored and visible in ClickHouse (with a progress bar)."""
    from tqdm import tqdm

    deadline = time.monotonic() + timeout_s
    with tqdm(total=expected, desc="scored trajectories in ClickHouse", unit="trajectory") as bar:
        while True:
            supervisor.poll()
            done = _count_trajectories(config)
            bar.update(max(0, done - bar.n))
            if done >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    if done < expected:
        output.warn(f"[demo] warning: only {done}/{expected} trajectories visible after {timeout_s:.0f}s")
    _wait_for_batches(config, supervisor)


def _wait_for_batches(config, supervisor, settle_s: float = 4.0, timeout_s: float = 40.0) -> None:
    """The batch builder flushes ready trajectories every few seconds: wait until its batches
    stop changing."""
    output.say("[demo] waiting for the batch builder to flush its batches...")
    deadline = time.monotonic() + timeout_s
    last, stable_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        supervisor.poll()
        count = _scalar(config, "SELECT count() FROM agentstream.batches FINAL")
        if count != last:
            last, stable_since = count, time.monotonic()
        elif count > 0 and time.monotonic() - stable_since >= settle_s:
            return
        time.sleep(0.5)


def _scalar(config, sql: str) -> int:
    try:
        rows = config.query(sql)
    except Exception:  # the table may not exist yet
        return 0
    return int(rows[0][0]) if rows else 0


def _count_trajectories(config) -> int:
    from clients.clickhouse.client import chdb_path, live_endpoint

    path = chdb_path(config.clickhouse_url)
    if path is not None and not live_endpoint(path):
        return 0  # the sink serves the embedded database once it has started; do not race it
    try:
        rows = config.query("SELECT uniqExact(trajectory_id) FROM agentstream.trajectories")
    except Exception:
        return 0
    return int(rows[0][0]) if rows else 0


def print_results(config, data_dir: Path) -> None:
    from infra.clickhouse.analytics import leaderboard_rows
    from infra.terminal.tables import format_table

    output.say("\n== Leaderboard (by model) ==")
    output.say(format_table(leaderboard_rows(config.query, by="model")))
    output.say("\n== Mean rule reward by step index ==")
    rows = config.query(
        "SELECT step_index, round(avg(score), 3) AS mean_rule_reward, count() AS steps "
        "FROM agentstream.rule_rewards FINAL WHERE score IS NOT NULL GROUP BY step_index ORDER BY step_index",
    )
    output.say(format_table([{"step": r[0], "mean rule reward": r[1], "steps": r[2]} for r in rows]))
    dlq = config.query("SELECT count() FROM agentstream.dead_letters FINAL")[0][0]
    output.say(f"\n== Dead letters: {dlq} ==")
    print_batches(data_dir / "batches")


def print_batches(root: Path) -> None:
    """Training batches per kind, from the manifests the trainer wrote."""
    import json

    from infra.terminal.tables import format_table

    kinds: dict[str, dict] = {}
    for manifest in sorted(root.glob("*/*.manifest.json")) if root.exists() else []:
        data = json.loads(manifest.read_text())
        entry = kinds.setdefault(
            data["kind"], {"kind": data["kind"], "batches": 0, "rows": 0, "trajectories": 0}
        )
        entry["batches"] += 1
        entry["rows"] += int(data.get("row_count", 0))
        entry["trajectories"] += len(data.get("trajectory_ids", []))
    output.say(f"\n== Training batches built: {sum(k['batches'] for k in kinds.values())} (under {root}) ==")
    output.say(format_table([kinds[k] for k in sorted(kinds)]))

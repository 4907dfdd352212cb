"""`agentstream demo --learn`: the whole loop on one machine, no network, and whether it learns.

1. Split calc expressions into training and held-out sets (disjoint, fixed by the seed) and build
   the warm-started tiny model (infra/learn/warmstart.py).
2. Evaluate version 0 (the warm start) on the held-out tasks.
3. Start the embedded stack with the policy server and the executor (`up --policy --train`): the
   policy server serves the warm start and reloads every new version; the rule processor scores
   every step; the assembler builds trajectories; the trainer makes GRPO batches of whole groups;
   the executor trains them asynchronously (TIS correction, staleness 2) and publishes versions.
4. Run `agentstream rollout --forever` on the training tasks in groups, against the policy server.
5. For each new version (the newest one when several arrive during an evaluation): evaluate it on
   the held-out tasks in this process, print a line, until `versions` or the time budget.
6. Write `learning_curve.json` and `learning_curve.png` (success and mean online reward by version
   and by wall time) under the data directory, and print version 0 against the final version.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from infra.learn.heldout import HeldoutScore, evaluate, load_engine
from infra.learn.tasks import split_expressions, write_tasks
from infra.learn.warmstart import WarmStartConfig, build_warm_model
from infra.runtime import agentstream_argv, stop_child
from infra.terminal import output
from schemas.policy_versions import version_number


@dataclass(frozen=True)
class LearnConfig:
    seed: int = 0
    difficulty: int = 1
    draws: int = 4000
    heldout: int = 40
    eval_samples: int = 2
    eval_temperature: float = 1.0
    max_turns: int = 3
    group_size: int = 8
    concurrency: int = 4
    batch_trajectories: int = 32
    learning_rate: float = 1e-3
    versions: int = 1000
    budget_min: float = 15.0
    warm: WarmStartConfig = field(default_factory=WarmStartConfig)


@dataclass
class Curve:
    started: float
    points: list[dict] = field(default_factory=list)

    def add(self, score: HeldoutScore, mean_reward: float | None = None) -> dict:
        point = {
            "version": score.version,
            "version_number": version_number(score.version),
            "minutes": round((time.monotonic() - self.started) / 60, 2),
            "success": round(score.rate, 4),
            "successes": score.successes,
            "episodes": score.episodes,
            "mean_reward": mean_reward,
        }
        self.points.append(point)
        return point


def learn_command(args) -> int:
    from schemas.settings import Settings

    config = LearnConfig(seed=args.seed, versions=args.versions, budget_min=args.budget_min)
    signal.signal(signal.SIGTERM, _exit)  # a SIGTERM stops the rollout and the stack like Ctrl-C
    data_dir = (Path(Settings.from_args(args).data_dir) / "demo-learn").resolve()
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    curve = Curve(time.monotonic())
    split = split_expressions(config.difficulty, config.draws, config.heldout, config.seed)
    output.say(f"[learn] {len(split.train)} training and {len(split.heldout)} held-out calc tasks (disjoint)")
    base = build_warm_model(data_dir / "models" / "calc-warm", split.train, config.warm, _say)
    engine = load_engine(base, None, "base")
    _report(curve.add(_evaluate(engine, split.heldout, config)))
    run_loop(config, data_dir, base, engine, split, curve)
    return finish(config, data_dir, curve)


def _exit(signum, _frame) -> None:
    raise SystemExit(128 + signum)


def _say(message: str) -> None:
    output.say(f"[learn] {message}")


def _evaluate(engine, heldout, config: LearnConfig) -> HeldoutScore:
    return evaluate(
        engine, heldout, config.eval_samples, config.eval_temperature, config.max_turns, config.seed
    )


def _report(point: dict) -> None:
    reward = "-" if point["mean_reward"] is None else f"{point['mean_reward']:.3f}"
    output.say(
        f"[learn] {point['version']:>5}  held-out success {point['success']:.3f} "
        f"({point['successes']}/{point['episodes']})  mean reward {reward}  at {point['minutes']:.1f} min"
    )


def stack_config(config: LearnConfig, data_dir: Path, base: Path):
    """The embedded stack of the demo: policy server + executor on the warm-started model, the
    trainer building GRPO batches only (every component takes its options from the environment)."""
    from infra.stack import embedded_config

    env = {
        "AGENTSTREAM_BASE_MODEL": str(base),  # the one base: policy server, executor, batch builder
        "AGENTSTREAM_KINDS": "grpo",
        "AGENTSTREAM_GROUP_SIZE": str(config.group_size),
        "AGENTSTREAM_BATCH_TRAJECTORIES": str(config.batch_trajectories),
        "AGENTSTREAM_FLUSH_INTERVAL_S": "20",
        "AGENTSTREAM_DROP_ZERO_STD": "true",  # a group that all failed (or all passed) teaches nothing
        "AGENTSTREAM_SEED": str(config.seed),
    }
    train_args = ("--learning-rate", str(config.learning_rate), "--micro-batch-size", "8")
    return embedded_config(
        data_dir, policy=True, policy_port=_free_port(), train=True, train_args=train_args, extra_env=env
    )


def _free_port() -> int:
    from infra.stack import free_port

    return free_port()


def rollout_args(
    config: LearnConfig, tasks: Path, policy_url: str, bootstrap: str, data_dir: Path
) -> list[str]:
    return agentstream_argv(
        "rollout", "--env", "calc", "--tasks", str(tasks),
        "--group-size", str(config.group_size), "--concurrency", str(config.concurrency),
        "--max-turns", str(config.max_turns), "--max-tokens", "48", "--temperature", "1.0", "--forever",
        "--max-staleness", "2", "--max-ahead", str(config.batch_trajectories),
        "--policy-url", policy_url, "--bootstrap-servers", bootstrap,
        "--data-dir", str(data_dir / "rollout"),
    )  # fmt: skip


def run_loop(config: LearnConfig, data_dir: Path, base: Path, engine, split, curve: Curve) -> None:
    """Steps 3-5 of the module docstring."""
    from infra.stack import StackSupervisor

    stack = stack_config(config, data_dir, base)
    supervisor = StackSupervisor(stack, on_event=lambda m: output.say(f"[learn] {m}"))
    supervisor.start(ready_timeout_s=180)
    tasks = write_tasks(split.train, data_dir / "train_tasks.jsonl", "calc-train")
    policy_url = f"http://127.0.0.1:{stack.policy_port}/v1"
    log = open(data_dir / "logs" / "rollout.log", "ab")  # noqa: SIM115 - closed below
    rollout = subprocess.Popen(
        rollout_args(config, tasks, policy_url, stack.bootstrap_servers, data_dir),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=data_dir,
    )  # fmt: skip
    try:
        follow_versions(config, stack, engine, split.heldout, curve)
        rewards = mean_rewards(stack)
        for point in curve.points:
            point["mean_reward"] = rewards.get(point["version"])
    finally:
        stop_child(rollout)
        log.close()
        supervisor.stop()


def learn_policy_reader(bootstrap_servers: str):
    """The current-policy reader learn follows versions with."""
    from clients.current_policy import CurrentPolicyReader

    return CurrentPolicyReader(bootstrap_servers, timeout_s=30.0, client_id="agentstream-learn")


def version_to_evaluate(reader, done: set[str]):
    """The current policy (`PolicyUpdated`) when learn has not evaluated its version yet, else None."""
    current = reader.current()
    return current if current is not None and current.policy_version not in done else None


def follow_versions(config: LearnConfig, stack, engine, heldout, curve: Curve) -> None:
    """Evaluate the current policy (`clients.current_policy`) each time it changes, until
    `versions` evaluations or the budget runs out; versions made during an evaluation are skipped
    for the newest."""
    deadline = curve.started + config.budget_min * 60 - 45  # leave time to stop and plot
    done: set[str] = set()
    last_eval_s = 0.0  # no evaluation starts that would end past the budget
    with learn_policy_reader(stack.bootstrap_servers) as reader:
        while time.monotonic() + last_eval_s < deadline and len(done) < config.versions:
            current = version_to_evaluate(reader, done)
            if current is None:
                time.sleep(2)
                continue
            done.add(current.policy_version)
            version_engine = engine.with_checkpoint(Path(current.checkpoint_path), current.policy_version)
            started = time.monotonic()
            _report(curve.add(_evaluate(version_engine, heldout, config)))
            last_eval_s = time.monotonic() - started


def mean_rewards(stack) -> dict[str, float]:
    """Mean online total reward of the rollouts' trajectories, by the version that sampled them."""
    sql = (
        "SELECT ifNull(policy_version, 'base'), avg(total_reward) FROM agentstream.trajectories FINAL "
        "WHERE total_reward IS NOT NULL AND reward_version IN "
        "(SELECT reward_version FROM agentstream.trajectory_versions WHERE live) GROUP BY 1"
    )
    try:
        return {version: round(float(mean), 4) for version, mean in stack.query(sql)}
    except Exception as exc:  # the curve is still worth writing without rewards
        output.say(f"[learn] mean rewards unavailable: {exc}")
        return {}


def finish(config: LearnConfig, data_dir: Path, curve: Curve) -> int:
    """Write the curve (JSON + PNG) and print version 0 against the final version."""
    from infra.learn.curve import write_curve

    first, last = curve.points[0], curve.points[-1]
    summary = {
        "config": asdict(config),
        "points": curve.points,
        "v0_success": first["success"],
        "final_version": last["version"],
        "final_success": last["success"],
        "gain_points": round(100 * (last["success"] - first["success"]), 1),
        "minutes": last["minutes"],
    }
    (data_dir / "learning_curve.json").write_text(json.dumps(summary, indent=2))
    output.say("[learn] version  held-out success  mean online reward  minutes")
    for p in curve.points:
        reward = "-" if p["mean_reward"] is None else f"{p['mean_reward']:.3f}"
        output.say(f"[learn] {p['version']:>7}  {p['success']:16.3f}  {reward:>18}  {p['minutes']:7.1f}")
    title = f"agentstream demo --learn: held-out calc success {first['success']:.2f} -> {last['success']:.2f}"
    png = write_curve(curve.points, data_dir / "learning_curve.png", title)
    output.say(
        f"[learn] held-out success: version 0 {first['success']:.3f} -> "
        f"{last['version']} {last['success']:.3f} "
        f"({summary['gain_points']:+.1f} points) in {last['minutes']:.1f} min; curve: {png}"
    )
    return 0

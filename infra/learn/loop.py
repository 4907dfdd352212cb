"""`agentstream demo --learn`: the whole loop on one machine, no network, and whether it learns.

1. Split calc expressions into training and held-out sets (disjoint, fixed by the seed) and build
   the warm-started tiny model (infra/learn/warmstart.py), or take it from the warm-start cache
   (`<data dir>/cache/warm-start`, keyed by its configuration; `demo --learn` wipes only
   `<data dir>/demo-learn`).
2. Evaluate version 0 (the warm start) on the held-out tasks, sampled and greedy
   (`infra.learn.heldout.evaluate`, the evaluation `agentstream eval` uses). The time budget starts
   here: the warm start, cached or not, is not part of it.
3. Start the embedded stack with the policy server and the executor (`up --policy --train`): the
   policy server serves the warm start and reloads every new version; the rule processor scores
   every step; the assembler builds trajectories; the trainer makes GRPO batches of whole groups;
   the executor trains them asynchronously (TIS correction, staleness 2) and publishes versions.
4. Run `agentstream rollout --forever` on the training tasks in groups, against the policy server.
5. For each new version (the newest one when several arrive during an evaluation): evaluate it on
   the held-out tasks in this process, print a line, until `versions` or the time budget.
6. Evaluate version 0 and the final version on a harder held-out set (`hard_difficulty`, longer
   expressions than any trained on), write `learning_curve.json` and `learning_curve.png` (success
   and mean online reward by version and by wall time) under the data directory, and print version 0
   against the final version.

`--seed` reaches everything it names: the task split, the warm start (model initialisation, SFT
sampling, careless episodes), the executor (`AGENTSTREAM_SEED`: its LoRA initialisation), the
rollouts' sampling seeds (`rollout --seed`) and the evaluation seeds. A control run (`control=True`,
`agentstream bench learn`) is the same loop with the executor's learning rate forced to
`CONTROL_LEARNING_RATE`: the executor refuses a learning rate of 0, and a tiny one keeps everything
else identical (rollouts, batches, versions published and reloaded, evaluations). AdamW moves a weight
by about the learning rate per step whatever the gradient, so after a thousand steps no weight has
moved by more than 1e-9: the versions are the warm start, numerically.
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
from infra.learn.warmstart import WarmStartConfig, cached_warm_model
from infra.runtime import agentstream_argv, stop_child
from infra.terminal import output
from schemas.policy_versions import version_number

CONTROL_LEARNING_RATE = 1e-12
"""The control's learning rate (the executor refuses 0; see the module docstring)."""


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
    """minutes from version 0's evaluation to the last evaluation started (the warm start is outside)"""
    greedy: bool = True
    """also evaluate each version greedily (temperature 0, one episode per task)"""
    hard_difficulty: int = 2
    """difficulty of the harder held-out set evaluated at version 0 and the final version (0: none)"""
    drop_zero_std: bool = True
    """leave out groups whose rewards all agree (they teach nothing); off, they still make versions
    (zero advantages), which CI-sized runs with an untrained warm start need"""
    control: bool = False
    """the control run: the executor's learning rate is CONTROL_LEARNING_RATE"""
    warm: WarmStartConfig | None = None
    """the warm start (default: WarmStartConfig() with this config's seed); its seed must be `seed`"""

    def __post_init__(self):
        if self.warm is None:
            object.__setattr__(self, "warm", WarmStartConfig(seed=self.seed))
        elif self.warm.seed != self.seed:
            raise ValueError(f"warm.seed: {self.warm.seed!r} differs from seed {self.seed!r}")
        if self.budget_min <= 0:
            raise ValueError(f"budget_min: must be > 0, got {self.budget_min!r}")
        if self.hard_difficulty < 0:
            raise ValueError(f"hard_difficulty: must be >= 0, got {self.hard_difficulty!r}")

    @property
    def train_learning_rate(self) -> float:
        return CONTROL_LEARNING_RATE if self.control else self.learning_rate


@dataclass
class Curve:
    started: float
    points: list[dict] = field(default_factory=list)
    scores: list[HeldoutScore] = field(default_factory=list)

    def add(self, score: HeldoutScore, mean_reward: float | None = None) -> dict:
        point = {
            "version": score.version,
            "version_number": version_number(score.version),
            "minutes": round((time.monotonic() - self.started) / 60, 2),
            **figures(score),
            "mean_reward": mean_reward,
        }
        self.points.append(point)
        self.scores.append(score)
        return point


def figures(score: HeldoutScore) -> dict:
    """A score's figures for the curve and the JSON (greedy ones None when not evaluated)."""
    greedy = score.greedy_episodes > 0
    return {
        "success": round(score.rate, 4),
        "successes": score.successes,
        "episodes": score.episodes,
        "greedy_success": round(score.greedy_rate, 4) if greedy else None,
        "greedy_successes": score.greedy_successes if greedy else None,
        "greedy_episodes": score.greedy_episodes,
    }


def learn_command(args) -> int:
    from schemas.settings import Settings

    config = LearnConfig(seed=args.seed, versions=args.versions, budget_min=args.budget_min)
    signal.signal(signal.SIGTERM, _exit)  # a SIGTERM stops the rollout and the stack like Ctrl-C
    root = Path(Settings.from_args(args).data_dir).resolve()
    run_learning(config, root / "demo-learn", warm_cache(root))
    return 0


def warm_cache(data_dir: Path) -> Path:
    """The warm-start cache under a data directory (outside every directory a run wipes)."""
    return data_dir / "cache" / "warm-start"


def run_learning(config: LearnConfig, run_dir: Path, cache: Path) -> dict:
    """One whole run (steps 1-6 of the module docstring) in `run_dir`, wiped first; returns the
    summary written to `run_dir/learning_curve.json`."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    split = split_expressions(config.difficulty, config.draws, config.heldout, config.seed)
    hard = harder_heldout(config, split.train)
    output.say(
        f"[learn] seed {config.seed}{' (control)' if config.control else ''}: {len(split.train)} training "
        f"and {len(split.heldout)} held-out calc tasks (disjoint), {len(hard)} harder held-out"
    )
    started = time.monotonic()
    base = cached_warm_model(cache, split.train, config.warm, _say)
    warm_start_s = round(time.monotonic() - started, 1)
    engine = load_engine(base, None, "base")
    first = _evaluate(engine, split.heldout, config)
    curve = Curve(time.monotonic())
    _report(curve.add(first))
    hard_v0 = _evaluate(engine, hard, config) if hard else None
    final_engine = run_loop(config, run_dir, base, engine, split, curve) or engine
    hard_final = _evaluate(final_engine, hard, config) if hard else None
    harder = None
    if hard_v0 is not None and hard_final is not None:
        harder = {"difficulty": config.hard_difficulty, "v0": figures(hard_v0), "final": figures(hard_final)}
        harder["final"]["version"] = hard_final.version
    extra = {
        "warm_start": str(base),
        "warm_start_s": warm_start_s,
        "final_vs_v0": final_vs_v0(curve, config.seed),
        "harder": harder,
    }
    return finish(config, run_dir, curve, extra)


def final_vs_v0(curve: Curve, seed: int) -> dict:
    """The final version against version 0 on their paired sampled episodes (exact McNemar on
    success, paired bootstrap on reward; `infra.evaluation`), NaN figures as None."""
    import math

    from infra.evaluation.outcomes import compare_pair

    first, last = curve.scores[0], curve.scores[-1]
    pair = compare_pair(last.version, last.outcomes, first.version, first.outcomes, 2000, seed).as_dict()
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in pair.items()}


def harder_heldout(config: LearnConfig, train: tuple[str, ...]) -> tuple[str, ...]:
    """`heldout` expressions of `hard_difficulty` (none trained on), fixed by the seed."""
    if not config.hard_difficulty:
        return ()
    seed = config.seed + 7919  # its own draw order, not the training split's
    split = split_expressions(config.hard_difficulty, config.draws, config.heldout, seed)
    return tuple(e for e in split.heldout if e not in set(train))


def _exit(signum, _frame) -> None:
    raise SystemExit(128 + signum)


def _say(message: str) -> None:
    output.say(f"[learn] {message}")


def _evaluate(engine, heldout, config: LearnConfig) -> HeldoutScore:
    return evaluate(
        engine,
        heldout,
        config.eval_samples,
        config.eval_temperature,
        config.max_turns,
        config.seed,
        greedy=config.greedy,
    )


def _report(point: dict) -> None:
    reward = "-" if point["mean_reward"] is None else f"{point['mean_reward']:.3f}"
    greedy = "" if point["greedy_success"] is None else f", greedy {point['greedy_success']:.3f}"
    output.say(
        f"[learn] {point['version']:>5}  held-out success {point['success']:.3f} "
        f"({point['successes']}/{point['episodes']}){greedy}  mean reward {reward}  "
        f"at {point['minutes']:.1f} min"
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
        "AGENTSTREAM_DROP_ZERO_STD": "true" if config.drop_zero_std else "false",
        "AGENTSTREAM_SEED": str(config.seed),
    }
    train_args = ("--learning-rate", str(config.train_learning_rate), "--micro-batch-size", "8")
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
        "--max-staleness", "2", "--max-ahead", str(config.batch_trajectories), "--seed", str(config.seed),
        "--policy-url", policy_url, "--bootstrap-servers", bootstrap,
        "--data-dir", str(data_dir / "rollout"),
    )  # fmt: skip


def run_loop(config: LearnConfig, data_dir: Path, base: Path, engine, split, curve: Curve):
    """Steps 3-5 of the module docstring; returns the engine of the last version evaluated (None
    when no trained version was)."""
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
        last = follow_versions(config, stack, engine, split.heldout, curve)
        rewards = mean_rewards(stack)
        for point in curve.points:
            point["mean_reward"] = rewards.get(point["version"])
        return last
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


def follow_versions(config: LearnConfig, stack, engine, heldout, curve: Curve):
    """Evaluate the current policy (`clients.current_policy`) each time it changes, until
    `versions` evaluations or the budget runs out; versions made during an evaluation are skipped
    for the newest. Returns the engine of the last version evaluated, or None."""
    deadline = curve.started + config.budget_min * 60
    done: set[str] = set()
    last_eval_s = 0.0  # no evaluation starts that would end past the budget
    version_engine = None
    with learn_policy_reader(stack.bootstrap_servers) as reader:
        while time.monotonic() + last_eval_s < deadline and len(done) < config.versions:
            current = version_to_evaluate(reader, done)
            if current is None:
                time.sleep(2)
                continue
            done.add(current.policy_version)
            version_engine = engine.with_checkpoint(Path(current.checkpoint_path), current.policy_version)
            started = time.monotonic()
            point = curve.add(_evaluate(version_engine, heldout, config))
            point["learning_rate"] = current.metrics.get("lr")  # the last optimizer step's
            _report(point)
            last_eval_s = time.monotonic() - started
    return version_engine


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


def finish(config: LearnConfig, data_dir: Path, curve: Curve, extra: dict | None = None) -> dict:
    """Write the curve (JSON + PNG), print version 0 against the final version; returns the summary."""
    from infra.learn.curve import write_curve

    first, last = curve.points[0], curve.points[-1]
    summary = {
        "config": {**asdict(config), "train_learning_rate": config.train_learning_rate},
        "points": curve.points,
        "v0_success": first["success"],
        "final_version": last["version"],
        "final_success": last["success"],
        "gain_points": round(100 * (last["success"] - first["success"]), 1),
        "v0_greedy_success": first["greedy_success"],
        "final_greedy_success": last["greedy_success"],
        "greedy_gain_points": _gain(first["greedy_success"], last["greedy_success"]),
        "minutes_to_20_points": minutes_to_gain(curve.points, "success", 0.2),
        "greedy_minutes_to_20_points": minutes_to_gain(curve.points, "greedy_success", 0.2),
        "minutes": last["minutes"],
        **(extra or {}),
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
    summary["curve_png"] = str(png)
    return summary


def _gain(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else round(100 * (after - before), 1)


def minutes_to_gain(points: list[dict], key: str, gain: float) -> float | None:
    """Minutes of the first point at least `gain` above the first point's `key`, or None.

    >>> pts = [{"s": 0.3, "minutes": 0.0}, {"s": 0.4, "minutes": 2.0}, {"s": 0.5, "minutes": 3.5}]
    >>> minutes_to_gain(pts, "s", 0.2), minutes_to_gain(pts, "s", 0.3)
    (3.5, None)
    """
    start = points[0][key]
    if start is None:
        return None
    return next((p["minutes"] for p in points if p[key] is not None and p[key] - start >= gain - 1e-9), None)

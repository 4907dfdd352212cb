"""`agentstream bench learn`: does the loop learn, over seeds, against a control?

Per seed in `--seeds`, the loop of `demo --learn` (infra/learn/loop.py) with the same time budget:
its own task split, warm start (from the warm-start cache under `<data dir>/cache/warm-start`, so
repeated runs spend the budget on learning), executor seed and rollout sampling seeds. With
`--control` (the default) one more run, the first seed's, with the executor's learning rate forced to
`CONTROL_LEARNING_RATE` (the executor refuses 0; see the loop's docstring): same warm start, same
rollouts and versions, no learning. Each version is evaluated on the held-out tasks, sampled and
greedy (`infra.learn.heldout.evaluate`); version 0 and the final version also on a harder
difficulty.

Reported: per run, success at version 0 and at the final version (sampled and greedy), the gain in
points, minutes to +20 points, the final version against version 0 (exact McNemar on the paired
episodes), the harder difficulty; over the seeds, the mean gain with a 95% t interval; the control's
gain beside it. JSON (`--output`), the table, and a curve PNG beside the JSON. `--repeats` does not
apply: the seeds are the repeats. Runs go under `<data dir>/bench-learn/<run>` (wiped per run).

A bench of seeds x budget runs for hours, so nothing finished is lost to a kill: as each run ends its
summary is written beside the JSON (`<output stem>-<run>.json`, e.g. `learn-seed-0.json`) and the
JSON itself holds the summary so far (`"partial": true`, the runs done and planned), each written
whole (temp file + rename). Every option is checked before the first run.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from infra.errors import InfraError
from infra.options.env import add_option, positive_int

MAX_SEED = 2**31 - 1  # numpy's and torch's seeds take it; warm-start and rollout seeds derive from it
MAX_HARD_DIFFICULTY = 5  # the calc env's hardest (producers/envs/calc.py)

# two-sided 95% Student t quantiles by degrees of freedom (1..30); the normal 1.96 beyond
T_95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def add_arguments(parser) -> None:
    add_option(parser, "--seeds", default="0,1,2", help="comma-separated seeds, one loop run each")
    add_option(parser, "--budget-min", type=float, default=15.0, help="minutes of learning per run")
    add_option(
        parser, "--control", action="store_true", default=True,
        help="also a control run (the first seed, learning rate ~0)",
    )  # fmt: skip
    add_option(parser, "--versions", type=positive_int, default=1000, help="stop a run after N versions")
    add_option(parser, "--heldout", type=positive_int, default=40, help="held-out tasks (each difficulty)")
    add_option(parser, "--eval-samples", type=positive_int, default=2, help="sampled episodes per task")
    add_option(parser, "--hard-difficulty", type=int, default=2, help="harder held-out difficulty (0: none)")
    add_option(parser, "--group-size", type=positive_int, default=8, help="rollouts per task (GRPO group)")
    add_option(parser, "--batch-trajectories", type=positive_int, default=32, help="trajectories per batch")
    add_option(
        parser, "--drop-zero-std", action="store_true", default=True,
        help="leave out groups whose rewards all agree (--no-drop-zero-std: CI-sized runs)",
    )  # fmt: skip
    add_option(parser, "--warm-steps", type=positive_int, default=3000, help="warm start SFT steps")
    add_option(parser, "--warm-hidden-size", type=positive_int, default=128, help="warm start hidden size")
    add_option(parser, "--warm-layers", type=positive_int, default=2, help="warm start layers")


class BenchLearnError(InfraError, ValueError):
    """A `bench learn` option that cannot be used (names the option and the value)."""


def parse_seeds(text: str) -> list[int]:
    """`--seeds`: distinct integers from 0 to MAX_SEED.

    >>> parse_seeds("0, 1,2")
    [0, 1, 2]
    """
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BenchLearnError(f"--seeds: expected comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise BenchLearnError(f"--seeds: expected distinct integers, got {text!r}")
    outside = [seed for seed in seeds if not 0 <= seed <= MAX_SEED]
    if outside:
        raise BenchLearnError(
            f"--seeds: each seed must be from 0 to {MAX_SEED}, got {outside[0]} in {text!r}"
        )
    return seeds


def mean_interval(values: list[float]) -> dict:
    """Mean, sample standard deviation and two-sided 95% t interval of `values` (None where
    undefined: the interval needs two values).

    >>> mean_interval([10.0, 20.0, 30.0])
    {'n': 3, 'mean': 20.0, 'sd': 10.0, 'low': -4.84, 'high': 44.84}
    >>> mean_interval([5.0])["low"] is None
    True
    """
    n = len(values)
    if not n:
        return {"n": 0, "mean": None, "sd": None, "low": None, "high": None}
    mean = statistics.fmean(values)
    if n < 2:
        return {"n": 1, "mean": round(mean, 2), "sd": None, "low": None, "high": None}
    sd = statistics.stdev(values)
    half = (T_95[n - 2] if n - 1 <= len(T_95) else 1.96) * sd / math.sqrt(n)
    return {"n": n, "mean": round(mean, 2), "sd": round(sd, 2), "low": round(mean - half, 2),
            "high": round(mean + half, 2)}  # fmt: skip


def _configs(args) -> list[tuple[str, object]]:
    from infra.learn.loop import LearnConfig
    from infra.learn.warmstart import WarmStartConfig

    if not (math.isfinite(args.budget_min) and args.budget_min > 0):
        raise BenchLearnError(f"--budget-min: must be a finite number > 0, got {args.budget_min!r}")
    if not 0 <= args.hard_difficulty <= MAX_HARD_DIFFICULTY:
        raise BenchLearnError(
            f"--hard-difficulty: must be from 0 (none) to {MAX_HARD_DIFFICULTY}, got {args.hard_difficulty!r}"
        )
    seeds = parse_seeds(args.seeds)
    runs = [(f"seed {s}", s, False) for s in seeds] + ([("control", seeds[0], True)] if args.control else [])
    configs = []
    for name, seed, control in runs:
        warm = WarmStartConfig(
            hidden_size=args.warm_hidden_size, layers=args.warm_layers, steps=args.warm_steps, seed=seed
        )
        config = LearnConfig(
            seed=seed, budget_min=args.budget_min, versions=args.versions, heldout=args.heldout,
            eval_samples=args.eval_samples, hard_difficulty=args.hard_difficulty,
            group_size=args.group_size, batch_trajectories=args.batch_trajectories, control=control,
            drop_zero_std=args.drop_zero_std, warm=warm,
        )  # fmt: skip
        configs.append((name, config))
    return configs


def run(args) -> dict:
    from infra.learn.curve import write_runs_curve
    from infra.learn.loop import run_learning, warm_cache
    from schemas.settings import Settings

    configs = _configs(args)  # every option checked before the first run starts
    output = _output_path(args.output)
    root = Path(Settings.from_args(args).data_dir).resolve()
    runs: dict[str, dict] = {}
    for name, config in configs:
        runs[name] = run_learning(config, root / "bench-learn" / name.replace(" ", "-"), warm_cache(root))
        save_progress(output, runs, [n for n, _ in configs])
    result = summarize(runs)
    png = output.with_suffix(".png")
    title = f"agentstream bench learn: held-out calc success, {args.budget_min:g} min per run"
    result["curve_png"] = str(write_runs_curve({n: r["points"] for n, r in runs.items()}, png, title))
    result["notes"].append(f"curve: {png}")
    return result


def _output_path(value: str | None) -> Path:
    """`--output` (default bench-results/learn.json), its directory made as `write_report` does, and
    checked writable now rather than after the first run."""
    from infra.options.output_file import OutputFileError, checked_output_file

    value = value or "bench-results/learn.json"
    try:
        Path(value).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputFileError(f"--output={value!r}: its directory cannot be made ({exc})") from None
    return checked_output_file(value, "--output")


def run_file(output: Path, name: str) -> Path:
    """Where run `name`'s summary is saved when it ends: beside `output`.

    >>> run_file(Path("bench-results/learn.json"), "seed 0").as_posix()
    'bench-results/learn-seed-0.json'
    """
    return output.with_name(f"{output.stem}-{name.replace(' ', '-')}.json")


def save_progress(output: Path, runs: dict[str, dict], planned: list[str]) -> None:
    """The newest run's summary beside `output`, and `output` the summary of the runs so far
    (`"partial": true`), each written whole: a kill loses only the run in progress."""
    from infra.options.output_file import write_atomic

    name, last = next(reversed(runs.items()))
    write_atomic(run_file(output, name), json.dumps({"run": name, **last}, indent=2, default=str))
    so_far = {"benchmark": "learn", "partial": True, "runs_done": list(runs), "runs_planned": planned}
    so_far |= summarize(runs)
    so_far["notes"].insert(0, f"partial: {len(runs)} of {len(planned)} runs done")
    write_atomic(output, json.dumps(so_far, indent=2, default=str))


def summarize(runs: dict[str, dict]) -> dict:
    """The bench's JSON from the runs' summaries (`infra.learn.loop.finish`), keyed by run name;
    the run named "control" is left out of the means."""
    seeds = [r for name, r in runs.items() if name != "control"]
    control = runs.get("control")
    gains = mean_interval([r["gain_points"] for r in seeds])
    greedy = [r["greedy_gain_points"] for r in seeds if r["greedy_gain_points"] is not None]
    greedy_gains = mean_interval(greedy)
    reached = [r["minutes_to_20_points"] for r in seeds if r["minutes_to_20_points"] is not None]
    result = {
        "rows": [_row(name, r) for name, r in runs.items()],
        "mean_gain_points": gains,
        "mean_greedy_gain_points": greedy_gains,
        "control_gain_points": control["gain_points"] if control else None,
        "control_greedy_gain_points": control["greedy_gain_points"] if control else None,
        "reached_20_points": {"runs": len(reached), "of": len(seeds),
                              "median_minutes": statistics.median(reached) if reached else None},
        "runs": runs,
    }  # fmt: skip
    result["notes"] = [
        f"mean held-out gain over {gains['n']} seed(s): {_interval(gains)} points sampled, "
        f"{_interval(greedy_gains)} greedy",
        "control (learning rate ~0): "
        + (f"{control['gain_points']:+.1f} points sampled" if control else "not run"),
        f"+20 points reached in {len(reached)} of {len(seeds)} seed(s)"
        + (f", median {result['reached_20_points']['median_minutes']:.1f} min" if reached else ""),
    ]
    return result


def _interval(figures: dict) -> str:
    if figures["mean"] is None:
        return "-"
    if figures["low"] is None:
        return f"{figures['mean']:+.1f}"
    return f"{figures['mean']:+.1f} (95% CI {figures['low']:+.1f} to {figures['high']:+.1f})"


def _row(name: str, r: dict) -> dict:
    harder = r.get("harder") or {}
    paired = r.get("final_vs_v0") or {}

    def pct(value):
        return "-" if value is None else f"{100 * value:.1f}"

    return {
        "run": name,
        "versions": len(r["points"]) - 1,
        "final": r["final_version"],
        "v0 %": pct(r["v0_success"]),
        "final %": pct(r["final_success"]),
        "gain": f"{r['gain_points']:+.1f}",
        "v0 greedy %": pct(r["v0_greedy_success"]),
        "final greedy %": pct(r["final_greedy_success"]),
        "McNemar p": "-" if paired.get("mcnemar_p") is None else f"{paired['mcnemar_p']:.3g}",
        "min to +20": "-" if r["minutes_to_20_points"] is None else f"{r['minutes_to_20_points']:.1f}",
        f"d{harder.get('difficulty', '-')} v0 %": pct(harder.get("v0", {}).get("success")),
        f"d{harder.get('difficulty', '-')} final %": pct(harder.get("final", {}).get("success")),
        "minutes": f"{r['minutes']:.1f}",
    }

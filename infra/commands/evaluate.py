"""`agentstream eval`: a task set against one or more policy endpoints. Per endpoint: sampled success
with its 95% Wilson interval, greedy success (temperature 0, one episode per task) and pass@k; then
every pair of endpoints on their paired episodes (same task, same seed): the success difference with
the exact McNemar test, the paired bootstrap of the reward difference, both Holm-adjusted across all
pairs, and a verdict (`infra.evaluation`, the statistics `infra.learn.heldout` shares). The episodes
are recorded with purpose "eval": no batch builder trains on them.

`agentstream replay-trajectory`: re-run a recorded trajectory's tool calls in a fresh isolated
sandbox (`--sandbox-backend`, `auto` by default: producers/sandbox/choice.py; producers/rollout/
replay.py) and report the first step whose output differs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from infra.options.env import add_option, command_parser
from infra.terminal import output
from schemas.errors import AgentstreamError


class EvalError(AgentstreamError):
    """A bad `eval` or `replay-trajectory` request (message names the option and the value)."""


def register(sub) -> None:
    """Add `eval` and `replay-trajectory` to the `agentstream` parser."""
    parser = command_parser(sub, "eval", run_eval, "success of policy endpoints, paired tests")
    add_option(parser, "--env", default="calc", help="environment id (calc, ...)")
    parser.add_argument(
        "--policy-url", action="append", default=[], help="OpenAI-compatible endpoint (repeat to compare)"
    )
    add_option(parser, "--tasks", default="", help="JSONL task file (default: the env's built-in tasks)")
    add_option(parser, "--episodes-per-task", type=int, default=4, help="episodes per task and endpoint")
    add_option(parser, "--model", default="policy", help="model id to ask the endpoints for")
    add_option(parser, "--concurrency", type=int, default=4, help="episodes run at once")
    add_option(parser, "--max-turns", type=int, default=8, help="interaction turns per episode")
    add_option(parser, "--max-tokens", type=int, default=128, help="tokens per policy reply")
    add_option(parser, "--temperature", type=float, default=1.0, help="sampling temperature")
    add_option(
        parser, "--greedy", action="store_true", default=True,
        help="also one greedy episode (temperature 0) per task and endpoint",
    )  # fmt: skip
    add_option(parser, "--pass-k", default="", help="k values of pass@k, e.g. 1,2,4 (default: 1 and N)")
    add_option(parser, "--alpha", type=float, default=0.05, help="significance level of the verdicts")
    add_option(parser, "--bootstrap-resamples", type=int, default=10_000, help="paired bootstrap resamples")
    add_option(parser, "--bootstrap-seed", type=int, default=0, help="seed of the bootstrap resampling")
    add_option(parser, "--json", default="", help="also write every figure and outcome to this JSON file")
    replay = command_parser(
        sub, "replay-trajectory", run_replay, "re-run a trajectory's tool calls; report the first divergence"
    )
    add_option(replay, "--file", default="", help="trajectory file: steps JSON or any ingestible log")
    add_option(replay, "--trajectory-id", default="", help="a trajectory recorded in ClickHouse")
    add_option(
        replay,
        "--sandbox-backend",
        default="auto",
        choices=["auto", "local", "docker"],
        help="where the tool calls re-run: auto takes bubblewrap, then Docker, else refuses",
    )


# --- eval -------------------------------------------------------------------------------------------


def pass_ks(text: str, per_task: int) -> tuple[int, ...]:
    """The k values of `--pass-k` (default: 1 and the episodes per task), each within 1..per_task.

    >>> pass_ks("", 4), pass_ks("2,1,2", 4)
    ((1, 4), (1, 2))
    """
    if not text.strip():
        return tuple(sorted({1, per_task}))
    try:
        ks = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise EvalError(f"--pass-k={text!r}: expected comma-separated integers like 1,2,4") from None
    if ks[0] < 1 or ks[-1] > per_task:
        raise EvalError(f"--pass-k={text!r}: each k must be between 1 and --episodes-per-task={per_task}")
    return tuple(ks)


def policy_names(urls: list[str]) -> list[str]:
    """The endpoints' names in the report: the URL, with `#2`, `#3` ... when one is given again.

    >>> policy_names(["a", "b", "a"])
    ['a', 'b', 'a#2']
    """
    seen: dict[str, int] = {}
    names = []
    for url in urls:
        seen[url] = seen.get(url, 0) + 1
        names.append(url if seen[url] == 1 else f"{url}#{seen[url]}")
    return names


def build_report(played: list, ks: tuple[int, ...], resamples: int, seed: int, alpha: float) -> dict:
    """Summaries, pairwise comparisons and outcomes of the endpoints' episodes (pure)."""
    from infra.evaluation.outcomes import compare_all, episode_outcomes, summarize

    names = policy_names([p.policy_url for p in played])
    outcomes = [
        (name, episode_outcomes(p.sampled) + episode_outcomes(p.greedy, greedy=True))
        for name, p in zip(names, played, strict=True)
    ]
    return {
        "settings": {
            "pass_k": list(ks),
            "bootstrap_resamples": resamples,
            "bootstrap_seed": seed,
            "alpha": alpha,
        },
        "policies": [summarize(name, o, ks) for name, o in outcomes],
        "pairs": compare_all(outcomes, resamples, seed, alpha),
        "outcomes": {name: o for name, o in outcomes},
    }


def _p(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.4g}"


def summary_lines(report: dict) -> list[str]:
    """Per endpoint one line, then two lines per pair (success, reward)."""
    out = []
    for s in report["policies"]:
        greedy = (
            f"{s.greedy_successes}/{s.greedy_episodes} = {s.greedy_rate:.3f}" if s.greedy_episodes else "off"
        )
        passes = ", ".join(f"pass@{k} {v:.3f}" for k, v in s.pass_at.items())
        out.append(
            f"[eval] {s.name}: {s.successes}/{s.episodes} solved, success rate {s.rate:.3f} "
            f"(95% Wilson CI {s.low:.3f}-{s.high:.3f}); greedy {greedy}; {passes}"
        )
    for c in report["pairs"]:
        out.append(
            f"[eval] difference {c.a} - {c.b}: success {c.difference:+.3f} over {c.pairs} paired episodes "
            f"(discordant {c.a_only} vs {c.b_only}), McNemar exact p = {_p(c.mcnemar_p)}, "
            f"Holm-adjusted p = {_p(c.holm_p)} (alpha {c.alpha}): {c.verdict}"
        )
        out.append(
            f"[eval]   reward {c.reward_difference:+.3f} (95% paired bootstrap CI {c.reward_low:+.3f} to "
            f"{c.reward_high:+.3f}), p = {_p(c.reward_p)}, Holm-adjusted p = {_p(c.reward_holm_p)}"
        )
    return out


def report_json(report: dict) -> str:
    """The report as JSON (NaN -> null)."""
    from dataclasses import asdict

    def clean(value):
        if isinstance(value, float) and math.isnan(value):
            return None
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    data = {
        "settings": report["settings"],
        "policies": [s.as_dict() for s in report["policies"]],
        "pairs": [c.as_dict() for c in report["pairs"]],
        "outcomes": {name: [asdict(o) for o in o_list] for name, o_list in report["outcomes"].items()},
    }
    return json.dumps(clean(data), indent=2)


def run_eval(args) -> int:
    from producers.rollout.driver import RolloutConfig
    from producers.rollout.evaluate import evaluate

    ks, json_path = checked_options(args)  # every option checked before the first episode
    tasks = eval_tasks(args.env, args.tasks)
    config = RolloutConfig(
        env=args.env, model=args.model, tasks=args.tasks, group_size=args.episodes_per_task,
        concurrency=args.concurrency, max_turns=args.max_turns, max_tokens=args.max_tokens,
        temperature=args.temperature,
    )  # fmt: skip
    recorder = _recorder(args, config.model)
    try:
        played = evaluate(config, args.policy_url, tasks, recorder, _runner(), greedy=args.greedy)
    finally:
        recorder.close(timeout=60)
    report = build_report(played, ks, args.bootstrap_resamples, args.bootstrap_seed, args.alpha)
    output.lines(summary_lines(report))
    if json_path is not None:
        from infra.options.output_file import write_atomic

        write_atomic(json_path, report_json(report) + "\n")
        output.say(f"[eval] figures written to {json_path}")
    return 0


def checked_options(args) -> tuple[tuple[int, ...], Path | None]:
    """The k values of pass@k and the `--json` path, once every option has been checked (one
    `EvalError` or `OutputFileError` naming the option and the value): a bad option fails before
    any episode is played, not after."""
    from infra.evaluation.stats import MAX_RESAMPLES
    from infra.options.output_file import checked_output_file

    if not args.policy_url:
        raise EvalError("--policy-url: at least one endpoint is needed")
    for option, value in (
        ("--episodes-per-task", args.episodes_per_task),
        ("--concurrency", args.concurrency),
        ("--max-turns", args.max_turns),
        ("--max-tokens", args.max_tokens),
    ):
        if value < 1:
            raise EvalError(f"{option}={value}: must be at least 1")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise EvalError(f"--temperature={args.temperature}: must be a finite number >= 0")
    if not 0 < args.alpha < 1:  # NaN fails this too
        raise EvalError(f"--alpha={args.alpha}: must be between 0 and 1 (exclusive)")
    if not 1 <= args.bootstrap_resamples <= MAX_RESAMPLES:
        raise EvalError(
            f"--bootstrap-resamples={args.bootstrap_resamples}: must be between 1 and {MAX_RESAMPLES}"
        )
    if args.bootstrap_seed < 0:
        raise EvalError(f"--bootstrap-seed={args.bootstrap_seed}: must be >= 0")
    ks = pass_ks(args.pass_k, args.episodes_per_task)
    return ks, (checked_output_file(args.json, "--json") if args.json else None)


def eval_tasks(env: str, tasks_file: str) -> list:
    """The tasks of `--env` in `--tasks` (default: the env's built-in tasks), the others left out
    with a note; none of that env is an `EvalError` naming both options, never a switch to another
    env's tasks."""
    import producers.envs  # noqa: F401  (registers the built-in environments)
    from producers.envs.errors import EnvError
    from producers.envs.tasks import builtin_tasks, load_tasks

    try:
        tasks = load_tasks(tasks_file) if tasks_file else builtin_tasks(env)
    except EnvError as exc:
        raise EvalError(f"--tasks={tasks_file!r}: {exc}" if tasks_file else f"--env={env!r}: {exc}") from None
    chosen = [t for t in tasks if t.env == env]
    if not chosen:
        found = sorted({t.env for t in tasks})
        where = f"--tasks={tasks_file!r}" if tasks_file else "its built-in task file"
        raise EvalError(f"--env={env!r}: no task of this env in {where} (its tasks are of envs {found})")
    if len(chosen) < len(tasks):
        output.say(
            f"[eval] --tasks={tasks_file!r}: {len(tasks) - len(chosen)} task(s) of other envs left out"
        )
    return chosen


def _runner():
    """The episode runner: the rollout driver's `run` (tests substitute a fake)."""
    from producers.rollout.driver import run

    return run


def _recorder(args, model: str):
    from producers.sdk.recorder import AgentRecorder
    from schemas.settings import Settings

    settings = Settings.from_args(args)
    return AgentRecorder(
        settings.bootstrap_servers, Path(settings.data_dir), agent="eval", model=model, purpose="eval"
    )


# --- replay-trajectory ------------------------------------------------------------------------------


def run_replay(args) -> int:
    from producers.rollout.replay import load_steps, replay
    from producers.sandbox.choice import make_sandbox

    if bool(args.file) == bool(args.trajectory_id):
        raise EvalError("replay-trajectory: give exactly one of --file and --trajectory-id")
    steps = load_steps(Path(args.file)) if args.file else _stored_steps(args)
    with make_sandbox(args.sandbox_backend) as box:
        report = replay(steps, box)
    output.say(json.dumps(report.as_dict(), indent=2, default=str))
    return 0 if report.success else 1


def _stored_steps(args) -> list[dict]:
    """A trajectory's steps from ClickHouse (`steps` table, deduplicated), in step order."""
    from clients.clickhouse import DATABASE
    from clients.clickhouse.client import connect
    from infra.clickhouse.analytics import quote
    from schemas.settings import Settings

    client = connect(Settings.from_args(args).resolved_clickhouse_url, wait_s=5.0)
    try:
        rows = client.query(
            f"SELECT tool, params, observation FROM {DATABASE}.steps FINAL "
            f"WHERE trajectory_id = {quote(args.trajectory_id)} ORDER BY step_index"
        ).result_rows
    finally:
        client.close()
    if not rows:
        raise EvalError(f"--trajectory-id {args.trajectory_id!r}: no steps of this trajectory in ClickHouse")
    return [{"tool": t, "params": json.loads(p or "{}"), "observation": o} for t, p, o in rows]

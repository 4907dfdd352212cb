"""`agentstream eval`: a task set against one or more policy endpoints, with each one's success rate,
its 95% Wilson interval and, for two endpoints, the leaderboard's significance test (Welch's t-test
over the 0/1 outcomes, `infra.clickhouse.analytics.welch_p`).

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
    parser = command_parser(sub, "eval", run_eval, "success rate of policy endpoints on an env's tasks")
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


def compare(scores: list) -> dict | None:
    """For exactly two scores: the difference of success rates and the leaderboard's p-value."""
    from infra.clickhouse.analytics import ALPHA, welch_p

    if len(scores) != 2:
        return None
    a, b = scores
    p = welch_p(list(a.outcomes), list(b.outcomes))
    return {
        "difference": a.rate - b.rate, "p_value": p, "test": "welch_t (leaderboard)",
        "significant": bool(not math.isnan(p) and p < ALPHA),
    }  # fmt: skip


def summary_lines(scores: list, comparison: dict | None) -> list[str]:
    """One line per endpoint, then the comparison line (if any)."""
    out = [
        f"[eval] {s.policy_url}: {s.successes}/{s.episodes} solved, success rate {s.rate:.3f} "
        f"(95% Wilson CI {s.low:.3f}-{s.high:.3f})"
        for s in scores
    ]
    if comparison is not None:
        p = comparison["p_value"]
        shown = "n/a (no variance or < 2 episodes)" if math.isnan(p) else f"{p:.4g}"
        verdict = "significant" if comparison["significant"] else "not significant"
        out.append(
            f"[eval] difference {comparison['difference']:+.3f}, p = {shown} "
            f"({comparison['test']}, alpha 0.05: {verdict})"
        )
    return out


def run_eval(args) -> int:
    import producers.envs  # noqa: F401  (registers the built-in environments)
    from producers.envs.tasks import builtin_tasks, load_tasks
    from producers.rollout.driver import RolloutConfig
    from producers.rollout.evaluate import evaluate

    if not args.policy_url:
        raise EvalError("--policy-url: at least one endpoint is needed")
    if args.episodes_per_task < 1:
        raise EvalError(f"--episodes-per-task={args.episodes_per_task}: must be at least 1")
    tasks = load_tasks(args.tasks) if args.tasks else builtin_tasks(args.env)
    tasks = [t for t in tasks if t.env == args.env] or tasks
    config = RolloutConfig(
        env=args.env, model=args.model, tasks=args.tasks, group_size=args.episodes_per_task,
        concurrency=args.concurrency, max_turns=args.max_turns, max_tokens=args.max_tokens,
        temperature=args.temperature,
    )  # fmt: skip
    recorder = _recorder(args, config.model)
    try:
        scores = evaluate(config, args.policy_url, tasks, recorder, _runner())
    finally:
        recorder.close(timeout=60)
    output.lines(summary_lines(scores, compare(scores)))
    return 0


def _runner():
    """The episode runner: the rollout driver's `run` (tests substitute a fake)."""
    from producers.rollout.driver import run

    return run


def _recorder(args, model: str):
    from producers.sdk.recorder import AgentRecorder
    from schemas.settings import Settings

    settings = Settings.from_args(args)
    return AgentRecorder(settings.bootstrap_servers, Path(settings.data_dir), agent="eval", model=model)


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

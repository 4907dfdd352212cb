"""`agentstream replay`: recompute derived topics from the log under a reward version (infra.replay)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from datetime import UTC, datetime

from infra.cli.options import command_parser
from schemas.settings import Settings

log = logging.getLogger(__name__)


def register(sub) -> None:
    """Add `replay` to the `agentstream` parser."""
    parser = command_parser(
        sub,
        "replay",
        run_replay,
        "recompute rule rewards from the log under a reward version, as a separate consumer group",
    )
    parser.add_argument(
        "--roles", default="rules", help="comma-separated roles to replay (replayable now: rules)"
    )
    parser.add_argument(
        "--reward-version",
        required=True,
        help="version stamped on the recomputed rewards; the live one's (e.g. rules-1) reproduces it",
    )
    start = parser.add_mutually_exclusive_group()
    start.add_argument(
        "--from-beginning", action="store_true", help="read the sources from offset 0 (the default)"
    )
    start.add_argument(
        "--since",
        type=_timestamp,
        help="start at the first record at or after this time (ISO 8601, UTC if no zone)",
    )
    parser.add_argument(
        "--profiles", default=None, help="rules: a reward-profiles file for the new version (YAML/JSON)"
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="give up (exit 1) after this many seconds"
    )


def _timestamp(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO 8601 time, got {text!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def run_replay(args) -> int:
    from infra import replay
    from infra.cli import output
    from infra.supervisor import Component, Supervisor

    settings = Settings.from_args(args)
    roles = tuple(r.strip() for r in args.roles.split(",") if r.strip())
    plan = replay.make_plan(settings.bootstrap_servers, roles, args.reward_version, args.since)
    replay.commit_starts(settings.bootstrap_servers, plan)
    where = f"since {args.since.isoformat()}" if args.since else "from the beginning"
    output.say(
        f"replay {','.join(plan.roles)} under {plan.reward_version} {where}: "
        f"{plan.total:,} records, groups {', '.join(plan.group(r) for r in plan.roles)}"
    )
    children = [Component(role, _worker_args(args, plan, role), restart="replay") for role in plan.roles]
    env = {
        "AGENTSTREAM_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "AGENTSTREAM_DATA_DIR": str(settings.data_dir),
        "AGENTSTREAM_LOG_LEVEL": str(args.log_level),
    }
    supervisor = Supervisor(children, env=env, on_event=lambda m: log.warning("replay: %s", m))
    started = time.monotonic()
    try:
        supervisor.start()
        replay.follow(
            settings.bootstrap_servers,
            plan,
            alive=lambda: not supervisor.poll(),
            on_progress=_printer(),
            timeout_s=args.timeout,
        )
    finally:
        supervisor.stop()
    output.say(
        f"replay done: {plan.total:,} records per role in {time.monotonic() - started:.1f}s "
        f"under {plan.reward_version}"
    )
    return 0


def _worker_args(args, plan, role: str) -> tuple[str, ...]:
    argv = [
        "worker",
        "--roles",
        role,
        "--app-prefix",
        plan.app_prefix,
        "--reward-version",
        plan.reward_version,
    ]
    if role == "rules" and args.profiles:
        argv += ["--profiles-path", args.profiles]
    return tuple(argv)


def _printer():
    """Progress to stderr: rewritten in place on a terminal, a line every 5 s otherwise."""
    tty = sys.stderr.isatty()
    last = [0.0]

    def show(p) -> None:
        now = time.monotonic()
        finished = p.lag == 0
        if not tty and not finished and now - last[0] < 5.0:
            return
        last[0] = now
        share = 100.0 if not p.total else 100.0 * p.done / p.total
        line = (
            f"{p.role}: {p.done:,}/{p.total:,} records ({share:.0f}%), lag {p.lag:,}, {p.rate:,.0f} records/s"
        )
        sys.stderr.write(("\r" + line + ("\n" if finished else "")) if tty else line + "\n")
        sys.stderr.flush()

    return show

"""`agentstream replay`: recompute derived topics from the log under a reward version (infra.replay)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from datetime import UTC, datetime

from infra.options.env import add_option, command_parser
from schemas.settings import Settings

log = logging.getLogger(__name__)


def register(sub) -> None:
    """Add `replay` to the `agentstream` parser."""
    parser = command_parser(
        sub,
        "replay",
        run_replay,
        "recompute rewards and trajectories from the log under a reward version, as separate consumer groups",
    )
    parser.add_argument(
        "--roles",
        default="scoring",
        help="comma-separated roles to replay: judge, scoring (rule rewards and trajectories), batch "
        "(the batch builder; `trainer` is its old name) (the judge runs first, then scoring, then batch)",
    )
    parser.add_argument(
        "--reward-version",
        required=True,
        help="version stamped on the recomputed rewards; the live one's (e.g. rules-1) reproduces it",
    )
    add_option(
        parser,
        "--from-beginning",
        action="store_true",
        default=True,
        help="read the sources from offset 0 (--no-from-beginning: from --since)",
    )
    parser.add_argument(
        "--since",
        type=_timestamp,
        help="start at the first record at or after this time (ISO 8601, UTC if no zone)",
    )
    _add_worker_options(parser)
    parser.add_argument(
        "--timeout", type=float, default=None, help="give up (exit 1) after this many seconds"
    )


def _add_worker_options(parser) -> None:
    """Options passed on to the replayed workers (as the live stack has them)."""
    parser.add_argument(
        "--profiles",
        default=None,
        help="scoring: a reward-profiles file for the new version (YAML/JSON)",
    )
    parser.add_argument(
        "--judge-rules",
        default=None,
        help="judge, scoring: the judge rules file the live stack uses (AGENTSTREAM_JUDGE_RULES_PATH "
        "otherwise)",
    )
    add_option(
        parser,
        "--expect-judge",
        action="store_true",
        help="scoring: wait for the judge's results as the live scoring does beside a judge (implied "
        "by --roles ...,judge)",
    )
    parser.add_argument(
        "--grace-seconds",
        type=float,
        default=30.0,
        help="scoring: its grace period in the replay; after catching up the replay waits this long "
        "so incomplete trajectories are emitted (all input is already in the log)",
    )
    add_option(
        parser,
        "--batch-kinds",
        renamed_from="--trainer-kinds",
        help="batch: batch kinds (the batch builder's default otherwise)",
    )
    add_option(
        parser,
        "--batch-flush-s",
        renamed_from="--trainer-flush-s",
        type=float,
        default=2.0,
        help="batch: flush ready trajectories after this long (batches are also cut by count)",
    )
    add_option(
        parser,
        "--batch-idle-s",
        renamed_from="--trainer-idle-s",
        type=float,
        default=10.0,
        help="batch: done once it has had no input for this long (it then flushes and exits)",
    )


def check_start(args) -> None:
    """Where the replay starts, said once: offset 0 (`--from-beginning`, the default) or `--since`."""
    from infra.replay import ReplayError

    given = "from_beginning" in getattr(args, "_given", ())
    if args.since is not None and given and args.from_beginning:
        raise ReplayError("--from-beginning and --since: give one (where the replay starts)")
    if args.since is None and not args.from_beginning:
        raise ReplayError("--no-from-beginning: give --since TIME (where the replay starts instead)")


def _timestamp(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO 8601 time, got {text!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def run_replay(args) -> int:
    from infra import replay
    from infra.terminal import output
    from producers.reward_versions import completed_event, publish_completed

    settings = Settings.from_args(args)
    roles, notes = replay.current_roles(tuple(r.strip() for r in args.roles.split(",") if r.strip()))
    for note in notes:
        output.warn(note)
    check_start(args)
    if "judge" in roles:
        replay.check_judge()
    plan = replay.make_plan(settings.bootstrap_servers, roles, args.reward_version, args.since)
    replay.commit_starts(settings.bootstrap_servers, plan)
    where = f"since {args.since.isoformat()}" if args.since else "from the beginning"
    output.say(
        f"replay {','.join(plan.roles)} under {plan.reward_version} {where}: "
        f"{plan.total:,} records, groups {', '.join(plan.group(r) for r in plan.roles)}"
    )
    env = {
        "AGENTSTREAM_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "AGENTSTREAM_DATA_DIR": str(settings.data_dir),
        "AGENTSTREAM_LOG_LEVEL": str(args.log_level),
    }
    started, started_at = time.monotonic(), datetime.now(UTC)
    deadline = None if args.timeout is None else started + args.timeout
    done: tuple[str, ...] = ()
    for phase in replay.phases(plan.roles):
        plan = _run_phase(args, plan, phase, done, env, deadline)
        done += phase
    # registered complete: the readers' default version becomes this one (docs/reward-versions.md)
    event = completed_event(
        plan.reward_version, plan.roles, plan.ends, started_at, since=args.since, app_id=plan.app_prefix
    )
    publish_completed(settings.bootstrap_servers, event)
    output.say(
        f"replay done: {plan.total:,} records in {time.monotonic() - started:.1f}s "
        f"under {plan.reward_version}"
    )
    return 0


def _run_phase(args, plan, phase: tuple[str, ...], done: tuple[str, ...], env: dict, deadline):
    """Run the phase's roles until caught up (scoring: plus its grace period), then stop them.
    Sources that the roles already done wrote to are measured again first."""
    from infra import replay
    from infra.supervisor import Component, Supervisor

    bootstrap = env["AGENTSTREAM_BOOTSTRAP_SERVERS"]
    later = tuple(t for role in phase for t in replay.upstream_topics(plan, role, done))
    plan = plan.with_ends(replay.read_ends(bootstrap, later))
    children = [Component(role, _worker_args(args, plan, role), restart="replay") for role in phase]
    supervisor = Supervisor(children, env=env, on_event=lambda m: log.warning("replay: %s", m))
    try:
        supervisor.start()
        if phase == ("batch",):
            _wait_for_batch_builder(supervisor, deadline)
            return plan
        alive = lambda: not supervisor.poll()  # noqa: E731
        plan = replay.follow(bootstrap, plan, phase, alive, _printer(), deadline=deadline)
        if "scoring" in phase:
            replay.linger(args.grace_seconds + 2.0, alive, deadline)  # + two ticks of its grace timer
    finally:
        supervisor.stop()
    return plan


def _wait_for_batch_builder(supervisor, deadline: float | None) -> None:
    """The replayed batch builder is done when it exits 0 after `--idle-exit-s` without input: its
    committed offsets may stay behind for good (a group short of `--min-group-size` holds its
    members' offsets), so they cannot tell."""
    from infra.replay import ReplayError

    sys.stderr.write("batch: building batches until it has read everything and is idle\n")
    while not supervisor.poll():
        if deadline is not None and time.monotonic() > deadline:
            raise ReplayError("the batch builder did not finish before the timeout")
        time.sleep(0.5)
    code = supervisor.running["batch"].last_exit
    if code != 0:
        raise ReplayError(f"the replayed batch builder exited with {code} (see its log above)")
    sys.stderr.write("batch: done\n")


def _worker_args(args, plan, role: str) -> tuple[str, ...]:
    if role == "batch":  # its own command; its consumer group is an option, not an app id
        return _batch_args(args, plan)
    argv = [
        "worker",
        "--roles",
        role,
        "--app-prefix",
        plan.app_prefix,
        "--reward-version",
        plan.reward_version,
    ]
    if role == "scoring" and args.profiles:
        argv += ["--profiles", args.profiles]
    if role in ("judge", "scoring") and args.judge_rules:
        argv += ["--judge-rules", args.judge_rules]
    if role == "scoring":
        argv += ["--grace-seconds", str(args.grace_seconds)]
        if args.expect_judge or "judge" in plan.roles:
            argv.append("--expect-judge")
    return tuple(argv)


def _batch_args(args, plan) -> tuple[str, ...]:
    """The replayed batch builder: the replay's group, the version's trajectories only, batches cut by
    count and flushed within `--batch-flush-s`; a group still short of members, or of one reward
    definition, is built after `--grace-seconds` (all the input is in the log already, so a member
    that has not come by then is not coming within the replayed range)."""
    argv = ["batch", "--group-id", plan.group("batch"), "--reward-version", plan.reward_version]
    argv += ["--flush-interval-s", str(args.batch_flush_s), "--idle-exit-s", str(args.batch_idle_s)]
    argv += [
        "--group-timeout-s",
        str(args.grace_seconds),
        "--group-definition-wait-s",
        str(args.grace_seconds),
    ]
    if args.batch_kinds:
        argv += ["--kinds", args.batch_kinds]
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

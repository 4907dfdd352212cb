"""The ClickHouse commands (parsers and their thin handlers: connect, call, print); the queries they
run are the query layer's (infra/clickhouse/). Handlers import heavy modules inside themselves.

- `agentstream db migrate` / `agentstream db serve`: schema migrations; serve an embedded chDB path.
- `agentstream sql "SELECT ..."`: run SQL, print a table, CSV or JSON.
- `agentstream leaderboard`: per-group success rate, mean reward with bootstrap CI, Welch test vs best.
- `agentstream trajectory ID`: one trajectory step by step with every reward layer.
- `agentstream trajectories`: the filtered, paginated trajectory list (the console's list query).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import signal
import threading

from clients.clickhouse.client import chdb_path, connect
from infra.options.env import add_option, command_parser, group_parser
from infra.terminal.output import say, warn
from schemas.settings import Settings


def register(sub) -> None:
    """Add this package's subcommands to the `agentstream` parser."""
    db = group_parser(sub, "db", "ClickHouse schema: migrations, serving an embedded chDB path")
    migrate = command_parser(db, "migrate", migrate_cmd, "apply pending ClickHouse migrations")
    add_option(
        migrate, "--events-ttl-days", type=int, help="expire raw `events` rows after N days (0: never)"
    )
    serve = command_parser(
        db, "serve", serve_cmd, "serve an embedded chDB path over ClickHouse HTTP on 127.0.0.1"
    )
    add_option(serve, "--port", type=int, default=0, env="AGENTSTREAM_CLICKHOUSE_PORT", help="port (0: free)")
    add_option(
        serve, "--reader-timeout-s", type=int, default=30,
        help="the engine cancels a reader's query after this many seconds (max_execution_time)",
    )  # fmt: skip
    add_option(
        serve, "--reader-max-memory-mb", type=int, default=2048,
        help="the engine cancels a reader's query that needs more memory (max_memory_usage)",
    )  # fmt: skip

    sql = command_parser(sub, "sql", sql_cmd, "run a SQL query against ClickHouse")
    sql.add_argument("query", help='the SQL, e.g. "SELECT count() FROM agentstream.events"')
    add_option(sql, "--format", choices=["table", "csv", "json"], default="table", help="output format")

    board = command_parser(
        sub,
        "leaderboard",
        leaderboard_cmd,
        "success rate and mean reward per model/agent/policy",
    )
    add_option(board, "--domain", help="only this domain")
    add_option(board, "--by", choices=["model", "agent", "policy_version"], default="model", help="group by")
    add_option(board, "--since", help="only episodes on or after this day (YYYY-MM-DD)")
    _reward_version_option(board)
    add_option(board, "--format", choices=["table", "csv", "json"], default="table", help="output format")

    traj = command_parser(sub, "trajectory", trajectory_cmd, "one trajectory step by step")
    traj.add_argument("trajectory_id", help="the trajectory id")
    _reward_version_option(traj)
    add_option(traj, "--format", choices=["table", "csv", "json"], default="table", help="output format")

    _register_trajectories(sub)


READ_VERSION_HELP = (
    "reward version shown, e.g. assembly-1+rules-2 or its rules version rules-2 (default: the newest "
    "complete one: the latest completed replay's, else the live version; docs/reward-versions.md)"
)


def _reward_version_option(parser) -> None:
    add_option(parser, "--reward-version", env="AGENTSTREAM_SHOW_REWARD_VERSION", help=READ_VERSION_HELP)


def _register_trajectories(sub) -> None:
    listing = command_parser(
        sub, "trajectories", trajectories_cmd, "list trajectories, filtered, newest first"
    )
    for name, text in (
        ("domain", "only this domain"),
        ("agent", "only this agent"),
        ("model", "only this model"),
        ("policy-version", "only episodes sampled by this policy version"),
        ("success", "true, false or any"),
        ("reward-min", "total reward at least this"),
        ("reward-max", "total reward at most this"),
        ("since", "ended at or after this date or time (UTC, e.g. 2026-11-25T14:30)"),
        ("until", "ended at or before this date or time (UTC)"),
        ("search", "case-insensitive text in the task"),
        ("reward-version", READ_VERSION_HELP),
        ("page", "page number, from 1"),
        ("page-size", "rows per page (at most 200)"),
    ):
        dest = f"filter_{name.replace('-', '_')}"
        env = "AGENTSTREAM_SHOW_REWARD_VERSION" if name == "reward-version" else None
        add_option(listing, f"--{name}", dest=dest, env=env, help=text)
    add_option(listing, "--format", choices=["table", "csv", "json"], default="table", help="output format")


log = logging.getLogger(__name__)


def _client(args, role: str = "reader"):
    """A reader unless told: through a served chDB path, only migrations write."""
    return connect(Settings.from_args(args).resolved_clickhouse_url, wait_s=5.0, role=role)


def render(rows: list[dict], fmt: str) -> str:
    """rows as a markdown table, CSV or JSON."""
    if fmt == "json":
        return json.dumps(rows, indent=2, default=str)
    if fmt == "csv":
        out = io.StringIO()
        if rows:
            writer = csv.DictWriter(out, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        return out.getvalue().rstrip("\n")
    from infra.terminal.tables import format_table

    return format_table(rows)


def migrate_cmd(args) -> int:
    from clients.clickhouse.migrate import apply_events_ttl, migrate

    client = _client(args, role="writer")
    try:
        applied = migrate(client)
        if args.events_ttl_days is not None:
            apply_events_ttl(client, args.events_ttl_days)
    finally:
        client.close()
    say(f"applied migrations: {', '.join(f'{v:04d}' for v in applied)}" if applied else "schema up to date")
    return 0


def serve_cmd(args) -> int:
    from clients.clickhouse import ClickHouseError
    from clients.clickhouse.client import open_and_serve
    from clients.clickhouse.engine import ReaderLimits
    from clients.clickhouse.migrate import migrate

    url = Settings.from_args(args).resolved_clickhouse_url
    if chdb_path(url) is None:
        raise ClickHouseError(f"clickhouse_url {url!r}: only an embedded chdb:// path can be served")
    for name in ("reader_timeout_s", "reader_max_memory_mb"):
        if getattr(args, name) < 1:
            raise ClickHouseError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")
    limits = ReaderLimits(args.reader_timeout_s, args.reader_max_memory_mb * 1024**2)
    client, endpoint = open_and_serve(url, port=args.port, prepare=migrate, limits=limits)
    if endpoint is None:
        say(f"already served by another process; use {url}")
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    say(f"serving {url} at {endpoint.url} (clickhouse-connect / curl); Ctrl-C to stop")
    stop.wait()
    endpoint.close()
    client.close()
    return 0


def sql_cmd(args) -> int:
    client = _client(args)
    try:
        result = client.query(args.query)
        rows = [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]
    finally:
        client.close()
    if rows or args.format != "table":
        say(render(rows, args.format))
    return 0


def leaderboard_cmd(args) -> int:
    from infra.clickhouse.analytics import BOOTSTRAP_RESAMPLES, leaderboard_report
    from infra.clickhouse.sql import run

    client = _client(args)
    try:
        choice, rows = leaderboard_report(
            lambda sql: run(client, sql), args.by, args.domain, args.since, BOOTSTRAP_RESAMPLES,
            args.reward_version,
        )  # fmt: skip
    finally:
        client.close()
    if args.format == "table":
        say(choice.describe())
        rows = [{k: v for k, v in row.items() if k != "reward_version"} for row in rows]
    say(render(rows, args.format))
    if args.format == "table":
        say(
            "\nmean reward: 95% bootstrap CI (2000 resamples, fixed seed); p_vs_best_welch: Welch t-test "
            "against the best row of the domain; p_holm: Holm-corrected; significant: p_holm < 0.05"
        )
    return 0


def trajectory_cmd(args) -> int:
    from infra.clickhouse.browse.trajectory_detail import trajectory_scores

    client = _client(args)
    try:
        episode, steps = trajectory_scores(client, args.trajectory_id, args.reward_version)
    finally:
        client.close()
    if args.format == "json":
        say(json.dumps({"episode": episode, "steps": steps}, indent=2, default=str))
        return 0
    stray = episode.pop("stray_labels")
    if args.format == "table":
        say(" ".join(f"{k}={v}" for k, v in episode.items() if v is not None))
        say("")
    say(render(steps, args.format))
    if stray and args.format == "table":  # a label `annotate` published for a step never taken
        say("\nhuman labels on steps this trajectory does not have:")
        say(
            render(
                [{k: a[k] for k in ("step_index", "rubric", "score", "annotator")} for a in stray], "table"
            )
        )
    elif stray:  # CSV is one table: the labels go to stderr rather than nowhere
        shown = ", ".join(f"step {a['step_index']} {a['rubric']}={a['score']}" for a in stray)
        warn(f"human labels on steps this trajectory does not have: {shown}")
    return 0


def trajectories_cmd(args) -> int:
    from infra.clickhouse.browse.filters import parse_filter
    from infra.clickhouse.browse.trajectory_list import trajectory_page

    given = {
        k[len("filter_") :]: v for k, v in vars(args).items() if k.startswith("filter_") and v is not None
    }
    page_filter = parse_filter(given)
    client = _client(args)
    try:
        page = trajectory_page(client, page_filter)
    finally:
        client.close()
    if args.format == "json":
        shown = {k: page[k] for k in ("rows", "total", "pages")}
        say(json.dumps({**shown, "reward_version": page["version"]["reward_version"]}, indent=2, default=str))
        return 0
    if args.format == "table":
        say(page["version"]["text"])
    say(render(page["rows"], args.format))
    if args.format == "table":
        say(f"\npage {page_filter.page} of {page['pages']} ({page['total']} trajectories)")
    return 0

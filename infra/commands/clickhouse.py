"""Subcommands contributed by this package (see infra/cli/main.py). Handlers are imported lazily.

- `agentstream db migrate` / `agentstream db serve`: schema migrations; serve an embedded chDB path.
- `agentstream sql "SELECT ..."`: run SQL, print a table, CSV or JSON.
- `agentstream leaderboard`: per-group success rate, mean reward with bootstrap CI, Welch test vs best.
- `agentstream trajectory ID`: one trajectory step by step with every reward layer.
- `agentstream trajectories`: the filtered, paginated trajectory list (the console's list query).
"""

from __future__ import annotations

from infra.cli.options import add_option, command_parser, group_parser
from infra.clickhouse.commands import (
    leaderboard_cmd,
    migrate_cmd,
    serve_cmd,
    sql_cmd,
    trajectories_cmd,
    trajectory_cmd,
)


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

"""Handlers of the ClickHouse commands (parsers in infra/clickhouse/cli.py). Thin: connect, call, print."""

from __future__ import annotations

import csv
import io
import json
import logging
import signal
import threading

from clients.clickhouse.client import chdb_path, connect
from infra.cli.output import say
from schemas.settings import Settings

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
    from infra.bench.report import format_table

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
    from infra.clickhouse.browse import trajectory_scores

    client = _client(args)
    try:
        episode, steps = trajectory_scores(client, args.trajectory_id, args.reward_version)
    finally:
        client.close()
    if args.format == "json":
        say(json.dumps({"episode": episode, "steps": steps}, indent=2, default=str))
        return 0
    if args.format == "table":
        say(" ".join(f"{k}={v}" for k, v in episode.items() if v is not None))
        say("")
    say(render(steps, args.format))
    return 0


def trajectories_cmd(args) -> int:
    from infra.clickhouse.browse import parse_filter, trajectory_page

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

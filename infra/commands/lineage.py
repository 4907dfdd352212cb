"""`agentstream lineage VERSION`: what trained a policy version, down to the step event ids and the
version that produced each (queries and report in `infra.lineage`; this module only wires them)."""

from __future__ import annotations

import json

from infra.options.env import add_option, command_parser
from infra.terminal import output


def register(sub) -> None:
    """Add `lineage` to the `agentstream` parser."""
    parser = command_parser(
        sub, "lineage", lineage_cmd, "what trained a policy version: batches, trajectories, step events"
    )
    parser.add_argument("version", help="the policy version, e.g. v3")
    add_option(parser, "--json", action="store_true", default=False, help="print every field as JSON")
    add_option(parser, "--limit", type=int, default=20, help="step event ids listed in the table output")


def lineage_cmd(args) -> int:
    from clients.clickhouse.client import connect
    from infra.clickhouse.sql import run_dicts
    from infra.lineage import collect, format_lineage
    from schemas.settings import Settings

    client = connect(Settings.from_args(args).resolved_clickhouse_url, wait_s=5.0)
    try:
        lineage = collect(lambda sql: run_dicts(client, sql), args.version)
    finally:
        client.close()
    if args.json:
        output.say(json.dumps(lineage, indent=2, default=str))
    else:
        output.say(format_lineage(lineage, limit=args.limit))
    return 0

"""`agentstream bench console`: its options, the run (data, serving, measure, clean-up) and the
report's notes. Target: under 300 ms server time at p95 (`measure.TARGET_MS`).

This process owns the chDB path and serves it on its loopback endpoint, as the sink does under
`agentstream up`; the overview (which asks Kafka) is never requested.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from infra.bench.console.measure import TARGET_MS, measure_console, pages, time_queries
from infra.bench.console.workload import load, settle
from infra.terminal.output import say


def add_arguments(parser) -> None:
    from infra.options.env import add_option

    add_option(parser, "--trajectories", type=int, default=100_000, help="trajectories in ClickHouse")
    add_option(parser, "--steps", type=int, default=200, help="steps of the trajectory whose page is timed")
    add_option(parser, "--filler-steps", type=int, default=2, help="steps of every other trajectory")
    add_option(
        parser, "--keep-data", action="store_true", help="keep the chDB directory (its path is printed)"
    )
    for action in parser._actions:  # the common --repeats: here, warm requests per page
        if action.dest == "repeats":
            action.default = 30
            action.help = "warm requests per page, after one cold one [env AGENTSTREAM_REPEATS; default 30]"


def run(args) -> dict:
    from clients.clickhouse.client import open_and_serve
    from clients.clickhouse.migrate import migrate

    root = Path(tempfile.mkdtemp(prefix="agentstream-bench-console-"))
    url = f"chdb://{root / 'clickhouse'}"
    page_list = pages(args.trajectories, args.steps)
    owner, endpoint = open_and_serve(url)  # this process owns the path and serves it, as the sink does
    try:
        migrate(owner)
        setup = load(owner, args.trajectories, args.steps, args.filler_steps)
        setup["merges_waited_s"] = settle(owner)
        rows, raw = measure_console(url, page_list, args.repeats)
        queries = time_queries(url, page_list, args.repeats)
    finally:
        if endpoint is not None:
            endpoint.close()
        owner.close()
        if args.keep_data:
            say(f"[console] chDB data kept in {root / 'clickhouse'}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return {
        "rows": rows,
        "queries": queries,
        "tables": {"Each query alone, through the same endpoint (ms)": "queries"},
        "target": {"server_p95_ms": TARGET_MS, "met": all(r["server p95 ms"] < TARGET_MS for r in rows)},
        "setup": {"trajectories": args.trajectories, "steps": args.steps, "filler_steps": args.filler_steps,
                  "repeats": args.repeats, **setup},
        "raw": raw,
        "notes": NOTES,
    }  # fmt: skip


NOTES = [
    "server time: the console's Server-Timing app;dur (handler, its ClickHouse queries and the page's "
    "rendering); client time: the whole HTTP request on a kept-alive loopback connection",
    "p50 / p95 / max over the warm requests (--repeats); cold: the first request to the page after start-up",
    "CPU ms/request: this whole process (console, chDB, its endpoint, background merges and view refreshes)",
    "chDB owned and served over its loopback endpoint by this process, as the sink does under `up`",
]

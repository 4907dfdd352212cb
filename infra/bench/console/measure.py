"""How `agentstream bench console` measures: the console (`infra.console.app.serve`) in a thread of
this process, reading through the chDB endpoint; per page one cold request, then `--repeats` warm
ones on a kept-alive connection (server time from `Server-Timing`, client time around the request,
CPU from `time.process_time`); then each query behind the pages alone, through a client of the same
endpoint: where the time goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from infra.bench.console.workload import LONG_ID, SEARCH_WORD
from infra.terminal.output import say

TARGET_MS = 300.0


@contextlib.contextmanager
def console_running(config):
    """The console (`infra.console.app.serve`) in a thread with its own event loop; yields its URL."""
    from concurrent.futures import FIRST_COMPLETED, Future, wait

    from infra.console.app import serve
    from infra.errors import ConsoleError

    loop, stop, listening = asyncio.new_event_loop(), asyncio.Event(), Future()
    thread = threading.Thread(target=loop.run_forever, name="bench-console", daemon=True)
    thread.start()
    served = asyncio.run_coroutine_threadsafe(
        serve(config, stop=stop, on_listening=listening.set_result), loop
    )
    try:
        wait([listening, served], timeout=60, return_when=FIRST_COMPLETED)
        if not listening.done():
            why = served.exception() if served.done() else "not listening after 60 s"
            raise ConsoleError(f"the console did not start: {why}")
        yield listening.result().rstrip("/")
    finally:
        loop.call_soon_threadsafe(stop.set)
        with contextlib.suppress(Exception):  # a failed start was reported above
            served.result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def server_ms(header: str | None) -> float:
    """The `app` duration of a Server-Timing header, in ms (nan without one).

    >>> server_ms("app;dur=12.5"), server_ms(None)
    (12.5, nan)
    """
    for metric in (header or "").split(","):
        name, _, params = metric.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if name == "app" and key == "dur":
                return float(value)
    return float("nan")


def request(conn, path: str) -> dict:
    """One GET on a kept-alive connection: server ms, client ms, this process's CPU ms, bytes."""
    from infra.errors import ConsoleError

    cpu, started = time.process_time(), time.perf_counter()
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    wall_ms, cpu_ms = (time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000
    if response.status != 200:
        raise ConsoleError(f"GET {path}: the console answered {response.status}: {body[:300]!r}")
    return {"server_ms": server_ms(response.getheader("Server-Timing")), "client_ms": wall_ms,
            "cpu_ms": cpu_ms, "bytes": len(body), "body": body}  # fmt: skip


# --- measure ---------------------------------------------------------------------------------------


def pages(trajectories: int, steps: int, page_size: int = 50) -> list[dict]:
    """The pages timed: the list, a filtered list, a deep page (page 200, or the last one when there
    are fewer), and the long trajectory."""
    from urllib.parse import urlencode

    deep = max(1, min(200, -(-trajectories // page_size)))
    lists = [
        ("list", {}),
        ("filtered", {"domain": "code", "success": "false", "search": SEARCH_WORD}),
        (f"page {deep}", {"page": str(deep)}),
    ]
    out = [
        {"page": n, "path": "/trajectories" + (f"?{urlencode(q)}" if q else ""), "query": q} for n, q in lists
    ]
    out.append({"page": f"trajectory ({steps} steps)", "path": f"/trajectories/{LONG_ID}", "query": None})
    return out  # fmt: skip


def shown(body: bytes) -> int:
    """What a page shows a person: trajectory rows of a list, or steps of a trajectory page."""
    return body.count(b"data-trajectory-id=") + body.count(b'<li class="step"')


def measure_page(url: str, page: dict, repeats: int) -> tuple[dict, dict]:
    """One cold request, then `repeats` warm ones on a kept-alive connection: the table row and the
    raw figures."""
    import http.client
    from urllib.parse import urlparse

    from infra.bench.report import median, percentile

    where = urlparse(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=120)
    try:
        cold = request(conn, page["path"])
        warm = [request(conn, page["path"]) for _ in range(max(1, repeats))]
    finally:
        conn.close()
    raw = {key: [r[key] for r in warm] for key in ("server_ms", "client_ms", "cpu_ms")}
    p95 = percentile(raw["server_ms"], 95)
    row = {
        "page": page["page"], "shown": shown(cold["body"]), "KB": cold["bytes"] / 1024,
        "cold server ms": cold["server_ms"], "cold client ms": cold["client_ms"],
        "server p50 ms": median(raw["server_ms"]), "server p95 ms": p95,
        "server max ms": max(raw["server_ms"]),
        "client p50 ms": median(raw["client_ms"]), "client p95 ms": percentile(raw["client_ms"], 95),
        "CPU ms/request": median(raw["cpu_ms"]),
        f"p95 < {TARGET_MS:.0f} ms": "met" if p95 < TARGET_MS else "not met",
    }  # fmt: skip
    raw["cold"] = {key: cold[key] for key in ("server_ms", "client_ms", "cpu_ms")}
    return row, {"path": page["path"], **raw}


def page_queries(page: dict) -> list[tuple[str, object]]:
    """The queries the console runs for `page`, named (`infra.clickhouse.browse`, and for a trajectory
    `infra.clickhouse.analytics.trajectory_sql`, which `trajectory_detail` runs too)."""
    from infra.clickhouse.analytics import trajectory_sql
    from infra.clickhouse.browse.filters import parse_filter
    from infra.clickhouse.browse.trajectory_detail import trajectory_detail_sql
    from infra.clickhouse.browse.trajectory_list import FACETS_SQL, trajectory_count_sql, trajectory_list_sql

    if page["query"] is None:
        detail = trajectory_detail_sql(LONG_ID).items()
        return [(f"detail {k}", q) for k, q in detail] + [
            (f"scores {k}", q) for k, q in trajectory_sql(LONG_ID).items()
        ]
    f = parse_filter(page["query"])
    return [("list", trajectory_list_sql(f)), ("count", trajectory_count_sql(f)),
            ("facets", FACETS_SQL)]  # fmt: skip


def time_queries(url: str, page_list: list[dict], repeats: int) -> list[dict]:
    """Each query behind the pages alone, `repeats` times, through a client of the same endpoint the
    console reads (the HTTP round trip included, the page's rendering not)."""
    from clients.clickhouse.client import connect
    from infra.bench.report import median, percentile
    from infra.clickhouse.sql import run as run_sql

    client = connect(url, autogenerate_session_id=False)
    rows = []
    try:
        for page in page_list:
            for name, query in page_queries(page):
                times, result = [], []
                for _ in range(max(1, repeats)):
                    started = time.perf_counter()
                    result = run_sql(client, query)
                    times.append((time.perf_counter() - started) * 1000)
                rows.append({"page": page["page"], "query": name, "rows": len(result),
                             "p50 ms": median(times), "p95 ms": percentile(times, 95)})  # fmt: skip
    finally:
        client.close()
    return rows


def measure_console(url: str, page_list: list[dict], repeats: int) -> tuple[list[dict], dict]:
    """Start the console in-process against `url`, time every page, stop it."""
    from infra.console.config import ConsoleConfig
    from infra.stack import free_port

    config = ConsoleConfig(clickhouse_url=url, bootstrap_servers=f"127.0.0.1:{free_port()}", port=0)
    rows, raw = [], {}
    with console_running(config) as base:
        say(f"[console] console at {base}/; {repeats} warm requests per page")
        for page in page_list:
            row, raw[page["page"]] = measure_page(base, page, repeats)
            rows.append(row)
            p50, p95 = row["server p50 ms"], row["server p95 ms"]
            say(f"[console] {page['page']}: server p50 {p50:.1f} ms, p95 {p95:.1f} ms")
    return rows, raw

"""`agentstream console`: the read-only web console (aiohttp + Jinja2, pages rendered on the server).

Routes: `/` overview (refreshes itself from `/api/overview`), `/trajectories` (filters in the URL),
`/trajectories/<trajectory_id>`, `/leaderboard`, `/training`, `/static/...` (the app's own assets:
nothing is fetched from elsewhere), `/healthz`. Every response carries `Server-Timing: app;dur=<ms>`
and the security headers of `SECURITY_HEADERS` (a content security policy that allows only the app's
own script, styles and requests, no framing, no sniffing, no referrer).

Who may ask: a request whose Host header does not name this console (`ConsoleConfig.host_allowed`)
gets 421 before anything else, with or without API keys (a page on another site that rebinds its
name to 127.0.0.1 cannot read it). Slow clients: a request head must arrive within
`header_timeout_s`; the console reads no request bodies (GET only), and an unread body is drained
for at most `LINGER_S`. A client that goes away mid-answer is a debug line.

Bad input never reaches a stack trace: an unknown trajectory is a 404 page, a malformed filter a 400
page naming the field and the value, ClickHouse trouble a 503 page with its one-line reason. The
data comes from `infra.console.data`, which runs the CLI's queries.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from infra.console import charts
from infra.console.config import ConsoleConfig
from infra.console.data import ConsoleData
from infra.console.rendering import page_templates
from infra.errors import FilterError

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
OBSERVATION_FOLD = 400  # characters shown before an observation is folded
LINGER_S = 5.0  # after an answer, an unread request body is drained this long at most
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; object-src 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def create_app(config: ConsoleConfig, data: ConsoleData | None = None):
    """The aiohttp application; `data` is injectable for tests and benchmarks."""
    from aiohttp import web

    app = web.Application(middlewares=[_timing, _host, _errors, _auth], client_max_size=64 * 1024)
    app.on_response_prepare.append(_security_headers)  # every response: pages, API, errors, assets
    app["config"] = config
    app["data"] = data or ConsoleData(config)
    app["templates"] = page_templates()
    app.router.add_get("/", overview_page)
    app.router.add_get("/api/overview", overview_api)
    app.router.add_get("/trajectories", trajectories_page)
    app.router.add_get("/trajectories/{trajectory_id}", trajectory_page)
    app.router.add_get("/leaderboard", leaderboard_page)
    app.router.add_get("/training", training_page)
    app.router.add_get("/training/versions/{version}", version_page)
    app.router.add_get("/healthz", healthz)
    app.router.add_static("/static/", HERE / "static", name="static", append_version=True)

    async def _close(app_):
        await asyncio.get_running_loop().run_in_executor(None, app_["data"].close)

    app.on_cleanup.append(_close)
    return app


# --- middlewares -----------------------------------------------------------------------------------


def _middleware(fn):
    from aiohttp import web

    return web.middleware(fn)


@_middleware
async def _timing(request, handler):
    started = time.perf_counter()
    response = await handler(request)
    response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.1f}"
    return response


async def _security_headers(request, response) -> None:
    response.headers.update(SECURITY_HEADERS)


@_middleware
async def _host(request, handler):
    """421 for a Host header that does not name this console (checked before keys, always)."""
    from aiohttp import web

    header = request.headers.get("Host")
    if request.app["config"].host_allowed(header):
        return await handler(request)
    log.info("console: refused Host %r from %s", header, request.remote)
    return web.Response(
        status=421,
        text=f"Host={header!r}: this console answers only its own names (loopback, or "
        "--allowed-hosts / AGENTSTREAM_CONSOLE_ALLOWED_HOSTS)",
    )


@_middleware
async def _errors(request, handler):
    from aiohttp import web

    try:
        return await handler(request)
    except FilterError as exc:
        return _error_page(request, 400, "That filter cannot be used", str(exc))
    except web.HTTPNotFound:
        return _error_page(request, 404, "Not found", f"Nothing is served at {request.path}.")
    except web.HTTPException:
        raise
    except (ConnectionResetError, asyncio.CancelledError):
        log.debug("console: the client went away during %s %s", request.method, request.path)
        raise
    except Exception as exc:
        return _unexpected(request, exc)


def _unexpected(request, exc: Exception):
    from clients.clickhouse import ClickHouseError

    name = type(exc).__name__
    if isinstance(exc, ClickHouseError) or "clickhouse" in type(exc).__module__:
        log.warning("ClickHouse query for %s failed: %s", request.path, exc)
        first_line = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else name
        return _error_page(request, 503, "ClickHouse is not answering", first_line)
    log.exception("console: %s %s failed", request.method, request.path)
    return _error_page(request, 500, "Something went wrong", f"{name}; the console's log has the details.")


def _error_page(request, status: int, title: str, message: str):
    if request.path.startswith("/api/"):
        return _json({"error": message}, status)
    return _render(request, "error.html", {"title": title, "message": message, "status": status}, status)


@_middleware
async def _auth(request, handler):
    from aiohttp import web

    config: ConsoleConfig = request.app["config"]
    if not config.keys_required or request.path == "/healthz":
        return await handler(request)
    from producers.gateway.requests import key_allowed

    if key_allowed(presented_key(request.headers), config.api_key_hashes):
        return await handler(request)
    return web.Response(
        status=401,
        text="an API key is required: Authorization: Bearer KEY, X-API-Key: KEY, or the key as the password",
        headers={"WWW-Authenticate": 'Basic realm="agentstream console", charset="UTF-8"'},
    )


def presented_key(headers) -> str | None:
    """The gateway's key headers, plus HTTP Basic with the key as the password (what a browser sends).

    >>> presented_key({"Authorization": "Basic " + base64.b64encode(b"me:KEY").decode()})
    'KEY'
    """
    from producers.gateway.requests import presented_key as gateway_key

    auth = headers.get("Authorization", "")
    if auth[:6].lower() == "basic ":
        try:
            return base64.b64decode(auth[6:].strip()).decode("utf-8").partition(":")[2] or None
        except ValueError:
            return None
    return gateway_key(headers)


# --- handlers --------------------------------------------------------------------------------------


async def _blocking(request, fn, *args):
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def _render(request, template: str, context: dict, status: int = 200):
    from aiohttp import web

    config: ConsoleConfig = request.app["config"]
    page = request.app["templates"].get_template(template)
    base = {"path": request.path, "refresh_s": config.refresh_s, "static": _static_url(request)}
    text = page.render(**base, **context)
    return web.Response(status=status, text=text, content_type="text/html", charset="utf-8")


def _static_url(request):
    def url(name: str) -> str:  # versioned (?v=<hash>): a new release is never served from a stale cache
        return str(request.app.router["static"].url_for(filename=name))

    return url


def _json(body: Any, status: int = 200):
    from aiohttp import web

    return web.Response(status=status, text=json.dumps(body, default=str), content_type="application/json")


async def healthz(request):
    return _json({"ok": True})


async def overview_page(request):
    overview = await _blocking(request, request.app["data"].overview)
    return _render(request, "overview.html", {"overview": overview, "title": "Overview"})


async def overview_api(request):
    return _json(await _blocking(request, request.app["data"].overview))


async def trajectories_page(request):
    page = await _blocking(request, request.app["data"].trajectories, dict(request.query))
    return _render(request, "trajectories.html", {"page": page, "f": page["filter"], "title": "Trajectories"})


async def trajectory_page(request):
    trajectory_id = request.match_info["trajectory_id"]
    version = request.query.get("reward_version")
    detail = await _blocking(request, request.app["data"].trajectory, trajectory_id, version)
    if detail is None:
        return _error_page(
            request, 404, "No such trajectory", f"ClickHouse has no trajectory with id {trajectory_id!r}."
        )
    if request.query.get("format") == "json":
        return _json(detail)
    context = {"t": detail, "fold": OBSERVATION_FOLD, "title": f"Trajectory {trajectory_id}"}
    return _render(request, "trajectory.html", context)


async def leaderboard_page(request):
    board = await _blocking(request, request.app["data"].leaderboard, dict(request.query))
    chart = _reward_by_step_chart(board["reward_by_step"])
    return _render(request, "leaderboard.html", {"b": board, "chart": chart, "title": "Leaderboard"})


async def training_page(request):
    training = await _blocking(request, request.app["data"].training)
    return _render(
        request, "training.html", {"tr": training, **_training_charts(training), "title": "Training"}
    )


async def version_page(request):
    version = request.match_info["version"]
    lineage = await _blocking(request, request.app["data"].lineage, version)
    if lineage is None:
        return _error_page(
            request, 404, "No such policy version", f"No policy version {version!r} was published."
        )
    if request.query.get("format") == "json":
        return _json(lineage)
    return _render(request, "version.html", {"l": lineage, "title": f"Policy version {version}"})


# --- charts (pure) ---------------------------------------------------------------------------------


def _markup(svg: str):
    from markupsafe import Markup

    return Markup(svg)  # charts.py escapes every label it draws


def _reward_by_step_chart(rows: list[dict]):
    steps = sorted({r["step_index"] for r in rows})
    series: dict[str, list] = {}
    for r in rows:
        series.setdefault(f"{r['domain']} rule", [None] * len(steps))[steps.index(r["step_index"])] = r[
            "mean_rule_score"
        ]
        if r["mean_judge_score"] is not None:
            series.setdefault(f"{r['domain']} judge", [None] * len(steps))[steps.index(r["step_index"])] = r[
                "mean_judge_score"
            ]
    chart = charts.line_chart(
        [str(s) for s in steps],
        series,
        "Mean reward by step index",
        "reward",
        _fraction_range([v for points in series.values() for v in points]),
    )
    return _markup(chart)


def _fraction_range(values: list) -> tuple[float, float] | None:
    """0 to 1 when every value is a fraction (success rates, rewards in [0, 1]), else fit the values.

    >>> _fraction_range([0.5, None, 1.0]), _fraction_range([0.5, 3.0])
    ((0.0, 1.0), None)
    """
    known = [v for v in values if v is not None and math.isfinite(v)]
    return (0.0, 1.0) if all(0.0 <= v <= 1.0 for v in known) else None


def _training_charts(training: dict) -> dict:
    times = sorted({r["t"] for r in training["batches_over_time"]})
    kinds: dict[str, list] = {}
    for r in training["batches_over_time"]:
        kinds.setdefault(r["kind"], [0] * len(times))[times.index(r["t"])] = r["rows"]
    labels = [t.strftime("%H:%M:%S") for t in times]
    curve = training["learning_curve"]
    versions = [r["policy_version"] or "(none)" for r in curve]
    return {
        "batches_chart": _markup(
            charts.line_chart(labels, kinds, "Rows in training batches, by kind", "rows")
        ),
        "curve_chart": _markup(
            charts.line_chart(
                versions,
                {
                    "success rate": [r["success_rate"] for r in curve],
                    "mean total reward": [r["mean_total_reward"] for r in curve],
                },
                "Learning curve: success and reward by policy version",
                y_range=_fraction_range(
                    [r["success_rate"] for r in curve] + [r["mean_total_reward"] for r in curve]
                ),
            )
        ),
    }


# --- serving ---------------------------------------------------------------------------------------


async def serve(
    config: ConsoleConfig,
    ready_file: str | None = None,
    stop: asyncio.Event | None = None,
    on_listening=None,
) -> None:
    """Serve until cancelled (or `stop` is set); writes `host:port` to `ready_file` once listening."""
    from aiohttp import web

    data = ConsoleData(config)
    await asyncio.get_running_loop().run_in_executor(None, data.clickhouse.client)  # fail early, clearly
    # aiohttp closes a connection that has not sent a whole request head `keepalive_timeout` after
    # it opened (or after the previous answer): that is the header timeout
    runner = web.AppRunner(
        create_app(config, data),
        access_log=None,
        keepalive_timeout=config.header_timeout_s,
        lingering_time=LINGER_S,
    )
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    host, port = runner.addresses[0][:2]
    log.info(
        "console at http://%s:%s/ (ClickHouse %s, Kafka %s)",
        host,
        port,
        config.clickhouse_url,
        config.bootstrap_servers,
    )
    if on_listening is not None:
        on_listening(f"http://{host}:{port}/")
    if ready_file:
        tmp = Path(ready_file).with_suffix(".tmp")
        tmp.write_text(f"{host}:{port}")
        tmp.replace(ready_file)
    try:
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        await runner.cleanup()

"""`agentstream env serve NAME`: one registered environment over HTTP, a session per episode (aiohttp).

Endpoints (the protocol, with every body and status, is docs/environment-protocol.md):
- `POST /v1/sessions` `{"env"?, "kwargs"?}` -> 201 the session (id, domain, tools).
- `POST /v1/sessions/{id}/reset` `{"task"?, "seed"?}` -> the first `TimeStep`.
- `POST /v1/sessions/{id}/step` `{"action": {"tool", "params"?, "thought"?}, "timeout_s"?}` -> a `TimeStep`.
- `GET /v1/sessions/{id}/observation` -> the last `TimeStep` (null before the first reset).
- `POST /v1/sessions/{id}/verify` `{}` -> `{"verified": true | false | null}` (the env's verifier).
- `DELETE /v1/sessions/{id}` -> the env closed (after a request it is running finishes).
- `GET /healthz` -> the env id and the session count, whatever the Host, without a key.

Every env call runs in a worker thread, one request at a time per session (409 while one runs) and
as many threads as sessions, so one slow step never holds up another session. Idle sessions
(`--idle-timeout-s`) and, at shutdown, all sessions are closed with their envs.

A client's `kwargs` may not name what the env leaves to the operator (`operator_kwargs`: a sandbox's
backend, limits, isolation, Docker engine and image; 400 `operator_kwarg`) or what `--env-args` fixed.

What a web page or a stranger can send is refused as the policy server refuses it: 415 for a POST
that is not `application/json`, 421 for a Host that is not this server's, 401 without a configured
key, 413 over the size limit; binds 127.0.0.1 by default and will not start on another address
without API keys. Errors are `{"error": {"code", "message", "field", "value"}}`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from producers.envs.errors import EnvError, EnvServiceError
from producers.envs.registry import spec as env_spec
from producers.envs.service.config import (
    EnvServiceConfig,
    TaskGate,
    check_fixed_kwargs,
    operator_kwargs,
    session_kwargs,
)
from producers.envs.service.sessions import Session, SessionTable, busy
from producers.envs.service.wire import (
    API,
    parse_create,
    parse_reset,
    parse_step,
    preview,
    request_object,
    timestep_to_wire,
)
from producers.gateway.requests import key_allowed, presented_key
from producers.http import serve_app
from producers.policy.server import host_allowed
from schemas.limits import MAX_ID_CHARS

log = logging.getLogger(__name__)

SESSION = API + "/sessions/{session_id}"
CLOSE_AT_SHUTDOWN_S = 30.0


def create_app(name: str, config: EnvServiceConfig):
    """The aiohttp application serving env `name` (a registered id)."""
    from aiohttp import web

    spec = env_spec(name)
    if spec is None:
        from producers.envs.registry import list_envs

        raise EnvError(f"env {name!r}: not a registered environment; registered: {list_envs()}")
    fixed = config.fixed_kwargs
    operator_kwargs(spec)  # a declaration naming no parameter fails here, before serving
    check_fixed_kwargs(spec, fixed)
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[_middleware()])
    app["config"], app["spec"], app["fixed"], app["gate"] = config, spec, fixed, TaskGate(name, config.tasks)
    app["sessions"] = SessionTable(config.max_sessions)
    app["pool"] = ThreadPoolExecutor(config.max_sessions + 2, thread_name_prefix="agentstream-env")
    app.router.add_post(API + "/sessions", _create)
    app.router.add_post(SESSION + "/reset", _reset)
    app.router.add_post(SESSION + "/step", _step)
    app.router.add_get(SESSION + "/observation", _observation)
    app.router.add_post(SESSION + "/verify", _verify)
    app.router.add_delete(SESSION, _delete)
    app.router.add_get("/healthz", _healthz)
    app.on_startup.append(_start_reaper)
    app.on_cleanup.append(_close_all)
    return app


def _json(status: int, body: dict, headers: dict | None = None):
    from aiohttp import web

    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


def _error(exc: EnvServiceError):
    headers = {"WWW-Authenticate": 'Bearer realm="agentstream"'} if exc.status == 401 else None
    if exc.status == 429:
        headers = {"Retry-After": "1"}
    return _json(exc.status, exc.body(), headers)


def _middleware():
    from aiohttp import web

    @web.middleware
    async def errors(request, handler):
        try:
            if request.path != "/healthz":
                _check_request(request)
            return await handler(request)
        except EnvServiceError as exc:
            return _error(exc)
        except web.HTTPRequestEntityTooLarge:
            limit = request.app["config"].max_body_bytes
            return _error(
                EnvServiceError(413, "too_large", f"body: over the size limit of {limit} bytes", "body")
            )
        except web.HTTPException as exc:  # no such route (404), method (405)
            code = (exc.reason or "error").lower().replace(" ", "_")
            message = f"{request.method} {request.path[:MAX_ID_CHARS]}: {exc.reason}"
            return _error(EnvServiceError(exc.status, code, message, "path", preview(request.path, 80)))
        except Exception:  # a bug of ours: the client still gets the error shape, the log the traceback
            log.exception("env server: %s %s failed", request.method, request.path)
            return _error(EnvServiceError(500, "server_error", "internal server error"))

    return errors


def _check_request(request) -> None:
    """421 for another Host, 401 without a configured key, 415 for a POST that is not JSON, 400 for a
    body where none is defined (see the module docstring)."""
    config: EnvServiceConfig = request.app["config"]
    host = request.headers.get("Host", "")
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    local = sockname[:2] if sockname else ("", 0)
    if not host_allowed(host, local[0], local[1], config.allowed_hosts):
        message = (
            f"Host: {host[:MAX_ID_CHARS]!r} is not this server's (localhost, 127.0.0.1 or [::1] with "
            f"port {local[1]}, or --allowed-hosts)"
        )
        raise EnvServiceError(421, "wrong_host", message, "Host", host[:MAX_ID_CHARS])
    if config.api_key_hashes and not key_allowed(presented_key(request.headers), config.api_key_hashes):
        raise EnvServiceError(401, "unauthorized", "missing or wrong API key (Authorization: Bearer KEY)")
    if request.method == "POST" and request.content_type != "application/json":
        given = request.headers.get("Content-Type", "")[:100]
        raise EnvServiceError(
            415,
            "unsupported_media_type",
            f"Content-Type: expected application/json, got {given!r}",
            "Content-Type",
            given,
        )
    if request.method in ("GET", "DELETE") and request.body_exists:
        raise EnvServiceError(400, "unexpected_body", f"body: {request.method} takes no body", "body")


async def _body(request, allowed: tuple[str, ...]) -> dict[str, Any]:
    config: EnvServiceConfig = request.app["config"]
    if request.content_length is not None and request.content_length > config.max_body_bytes:
        message = f"body: {request.content_length} bytes is over the size limit of {config.max_body_bytes}"
        raise EnvServiceError(413, "too_large", message, "body", request.content_length)
    return request_object(await request.read(), allowed)


async def _exclusive(app, session: Session, fn):
    """`fn()` in a worker thread as the session's one running call (409 while another runs). The
    call is shielded: a request cancelled meanwhile leaves it running, and the session counts as
    running until it returns, so no second call can overlap it."""
    if session.running:
        raise busy(session)
    session.running = True
    session.settled.clear()
    future = asyncio.get_running_loop().run_in_executor(app["pool"], fn)

    def settle(_):
        session.running, session.last_used = False, time.monotonic()
        session.settled.set()

    future.add_done_callback(settle)
    return await asyncio.shield(future)


async def _env_call(app, session: Session, fn, what: str, field: str, value: Any, status: int = 400):
    """`fn()` as the session's one running call: what the env refuses (`EnvError`) is `status` naming
    `field` and `value`, anything else it raises a 500; the server's own refusals pass as they are."""
    try:
        return await _exclusive(app, session, fn)
    except EnvServiceError:
        raise
    except EnvError as exc:
        message = f"{field}: {what} refused: {preview(str(exc))}"
        raise EnvServiceError(status, "env_refused", message, field, preview(value)) from None
    except Exception as exc:
        raise _env_failed(exc, what, session) from None


def _env_failed(exc: Exception, what: str, session: Session | None) -> EnvServiceError:
    """An env call that raised something other than `EnvError`: a 500 naming the call, logged."""
    where = f"session {session.id}" if session else "create"
    log.error("env server %s: %s raised %s: %s", where, what, type(exc).__name__, exc, exc_info=exc)
    message = f"{what}: the env raised {type(exc).__name__}: {preview(str(exc))}"
    return EnvServiceError(500, "env_failed", message)


async def _create(request):
    app = request.app
    kwargs = parse_create(await _body(request, ("env", "kwargs")), app["spec"].id)
    kwargs = session_kwargs(app["spec"], app["fixed"], kwargs)
    session = app["sessions"].reserve()
    future = asyncio.get_running_loop().run_in_executor(app["pool"], lambda: app["spec"].make(**kwargs))
    try:
        session.env = await asyncio.shield(future)
    except (EnvError, TypeError, ValueError) as exc:
        app["sessions"].release(session)
        message = f"kwargs: {preview(str(exc))}"
        raise EnvServiceError(400, "invalid_kwargs", message, "kwargs", preview(kwargs)) from None
    except Exception as exc:
        app["sessions"].release(session)
        raise _env_failed(exc, "create", None) from None
    except BaseException:  # cancelled: the env is closed when the factory returns it
        app["sessions"].release(session)
        future.add_done_callback(lambda done: _close_orphan(app, done))
        raise
    log.info("env server: session %s opened (%d open)", session.id, len(app["sessions"]))
    return _json(201, {"env": app["spec"].id, **session.describe()})


def _close_orphan(app, future) -> None:
    if not future.cancelled() and future.exception() is None:
        app["pool"].submit(future.result().close)


async def _reset(request):
    session = request.app["sessions"].get(request.match_info["session_id"])
    task, seed = parse_reset(await _body(request, ("task", "seed")))
    request.app["gate"].check(task)
    env = session.env

    def reset():
        ts = env.reset(task=task, seed=seed)
        session.last, session.started = ts, True
        return ts

    ts = await _env_call(request.app, session, reset, "reset", "task", task)
    return _json(200, {"timestep": timestep_to_wire(ts), "available_tools": list(env.available_tools)})


async def _step(request):
    session = request.app["sessions"].get(request.match_info["session_id"])
    action, timeout_s = parse_step(await _body(request, ("action", "timeout_s")))
    if not session.started:
        message = f"session_id: session {session.id}: step before reset; reset it first"
        raise EnvServiceError(409, "not_reset", message, "session_id", session.id)
    if session.done:
        message = f"session_id: session {session.id}: step after the episode ended; reset for a new one"
        raise EnvServiceError(409, "episode_over", message, "session_id", session.id)
    env = session.env

    def step():
        env.unwrapped.step_deadline = None if timeout_s is None else time.monotonic() + timeout_s
        ts = env.step(action)
        session.last = ts
        return ts

    ts = await _env_call(request.app, session, step, "step", "action", action)
    return _json(200, {"timestep": timestep_to_wire(ts)})


async def _observation(request):
    session = request.app["sessions"].get(request.match_info["session_id"])
    last = None if session.last is None else timestep_to_wire(session.last)
    return _json(200, {"timestep": last, "started": session.started, "done": session.done})


async def _verify(request):
    session = request.app["sessions"].get(request.match_info["session_id"])
    await _body(request, ())
    verdict = await _env_call(
        request.app, session, session.env.verify, "verify", "session_id", session.id, 409
    )
    if verdict is not None and not isinstance(verdict, bool):
        message = f"verify: the env answered {preview(verdict)!r}, not true, false or null"
        raise EnvServiceError(500, "env_output", message)
    return _json(200, {"verified": verdict})


async def _delete(request):
    session = request.app["sessions"].get(request.match_info["session_id"])
    await _close(request.app, session, "closed by the client")
    return _json(200, {"session_id": session.id, "closed": True})


async def _close(app, session: Session, why: str) -> None:
    """Close `session`'s env once a call it runs has returned, then free its slot."""
    session.closing = True
    try:
        await session.settled.wait()
        await _exclusive(app, session, session.env.close)
    except Exception:
        log.exception("env server: session %s: closing its env failed", session.id)
    finally:
        app["sessions"].release(session)
    log.info("env server: session %s %s (%d open)", session.id, why, len(app["sessions"]))


async def _healthz(request):
    app = request.app
    return _json(200, {"status": "ok", "env": app["spec"].id, "sessions": len(app["sessions"])})


async def _start_reaper(app) -> None:
    app["reaper"] = asyncio.get_running_loop().create_task(_reap(app))


async def _reap(app) -> None:
    """Close sessions idle for longer than `--idle-timeout-s` (checked a few times per timeout)."""
    timeout_s = app["config"].idle_timeout_s
    while True:
        await asyncio.sleep(min(timeout_s / 4, 5.0))
        for session in app["sessions"].idle(timeout_s):
            await _close(app, session, f"idle for over {timeout_s:g}s: closed")


async def _close_all(app) -> None:
    app["reaper"].cancel()
    sessions = app["sessions"].all()
    closes = [_close(app, s, "closed at shutdown") for s in sessions if s.env is not None and not s.closing]
    if closes:
        _, pending = await asyncio.wait(
            [asyncio.ensure_future(c) for c in closes], timeout=CLOSE_AT_SHUTDOWN_S
        )
        if pending:
            log.warning(
                "env server: %d sessions still closing after %gs; leaving", len(pending), CLOSE_AT_SHUTDOWN_S
            )
    app["pool"].shutdown(wait=False, cancel_futures=True)


async def serve(
    name: str, config: EnvServiceConfig, host: str, port: int, ready_file: str | None = None, on_ready=None
) -> None:
    """Serve env `name` until SIGTERM/SIGINT; writes "host:port" to `ready_file` and calls
    `on_ready("host:port")` once listening."""
    config.check_exposure(host)
    await serve_app(
        create_app(name, config), host, port, ready_file, f"env server ({name})", API, on_ready=on_ready
    )

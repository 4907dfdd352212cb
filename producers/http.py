"""Serving an aiohttp application until SIGTERM / SIGINT: the shell the gateway and the policy
server share (bind, announce the address, stop cleanly), and what every such server must hold
against slow and vanishing clients (issue #34):

- A connection that has not sent a request's headers within `header_timeout_s` is closed (aiohttp's
  keep-alive timer also runs from the moment a connection opens and closes it while no complete
  request has arrived; it is the same timer between requests, so an idle keep-alive connection goes
  after that long too).
- A request whose body has not arrived within `body_timeout_s` gets 408 and the connection is closed.
- A client that disconnects mid-request is a debug line, not an ERROR with a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0


# raised into a handler's body read when the body did not arrive in time (an instance, not a class of
# its own: nothing outside this module catches it)
_BODY_TIMEOUT = "request body timeout"


def guard_middleware(body_timeout_s: float = BODY_TIMEOUT_S):
    """An aiohttp middleware: 408 when the body takes longer than `body_timeout_s`, and a client
    disconnect logged as one debug line."""
    from aiohttp import web

    @web.middleware
    async def guard(request, handler):
        timer = None
        if request.body_exists:
            timer = asyncio.get_running_loop().call_later(body_timeout_s, _expire_body, request)
        try:
            return await handler(request)
        except TimeoutError as exc:
            if exc.args != (_BODY_TIMEOUT,):
                raise
            message = f"the request body did not arrive within {body_timeout_s:g} s"
            return web.json_response(
                {"error": "request timeout", "message": message}, status=408, headers={"Connection": "close"}
            )
        except ConnectionResetError as exc:
            if request.transport is not None and not request.transport.is_closing():
                raise  # not the client's connection: a real error
            log.debug("%s %s: client disconnected: %s", request.method, request.path, exc)
            return web.Response(status=400, text="client disconnected")  # nobody reads it
        finally:
            if timer is not None:
                timer.cancel()

    return guard


def _expire_body(request) -> None:
    if not request.content.is_eof():
        request.content.set_exception(TimeoutError(_BODY_TIMEOUT))


async def serve_app(
    app,
    host: str,
    port: int,
    ready_file: str | None,
    name: str,
    url_suffix: str = "",
    header_timeout_s: float = HEADER_TIMEOUT_S,
    body_timeout_s: float = BODY_TIMEOUT_S,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Run `app` on host:port (0: any free port) until SIGTERM / SIGINT; writes "host:port" to
    `ready_file` and calls `on_ready("host:port")` once listening, and lets in-flight requests finish
    on the way out."""
    from aiohttp import web

    app.middlewares.insert(0, guard_middleware(body_timeout_s))
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=header_timeout_s)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0]
    address = f"{bound[0]}:{bound[1]}"
    log.info("%s listening on http://%s%s", name, address, url_suffix)
    if ready_file:
        Path(ready_file).write_text(address)
    if on_ready is not None:
        on_ready(address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        log.info("%s stopping: in-flight requests finish", name)
    finally:
        await runner.cleanup()

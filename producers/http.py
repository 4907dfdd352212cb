"""Serving an aiohttp application until SIGTERM / SIGINT: the shell the gateway and the policy
server share (bind, announce the address, stop cleanly)."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

log = logging.getLogger(__name__)


async def serve_app(
    app, host: str, port: int, ready_file: str | None, name: str, url_suffix: str = ""
) -> None:
    """Run `app` on host:port (0: any free port) until SIGTERM / SIGINT; writes "host:port" to
    `ready_file` once listening, and lets in-flight requests finish on the way out."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0]
    address = f"{bound[0]}:{bound[1]}"
    log.info("%s listening on http://%s%s", name, address, url_suffix)
    if ready_file:
        Path(ready_file).write_text(address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        log.info("%s stopping: in-flight requests finish", name)
    finally:
        await runner.cleanup()

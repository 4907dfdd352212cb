"""The policy servers under test: the real aiohttp app (`producers.policy.server.create_app`)
per service on 127.0.0.1:0, in one event loop on a background thread of this process, so
`time.process_time()` covers client and server alike. `agentstream bench rollout` serves its policy
the same way.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def policy_servers(services: dict, workers: int) -> Iterator[dict[str, str]]:
    """The real aiohttp app per service on 127.0.0.1:0, in one event loop on a background thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="bench-policy-server", daemon=True)
    thread.start()
    runners = {}
    try:
        for name, service in services.items():
            runners[name] = asyncio.run_coroutine_threadsafe(_start(service, workers), loop).result(60)
        yield {name: url for name, (_, url) in runners.items()}
    finally:
        for runner, _ in runners.values():
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


async def _start(service, workers: int):
    from aiohttp import web

    from producers.policy.requests import PolicyConfig
    from producers.policy.server import create_app

    runner = web.AppRunner(create_app(PolicyConfig(workers=workers, follow=False), service), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"

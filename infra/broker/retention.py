"""Background maintenance of the broker: periodic jobs such as retention, compaction and flushes.

`run_periodically` runs a synchronous job every `interval_s` in a worker thread (the jobs are file
operations on the thread-safe store: deleting whole old segments, rewriting sealed segments of
compacted topics (infra.broker.compaction), fdatasync), so the event loop
keeps serving clients meanwhile. A failing job is logged and retried at the next tick; it never
stops the broker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


async def run_periodically(name: str, interval_s: float, job: Callable[[], object]) -> None:
    """Call `job()` every `interval_s` seconds until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(job)
        except Exception:
            log.exception("periodic %s job failed; retrying in %.1fs", name, interval_s)

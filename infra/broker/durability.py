"""Group commit: make appended records durable before they are acknowledged, sharing fsyncs.

With `--flush always` a produce is acknowledged only after its partition's data is fsynced. Rather
than fsync inside every append (which would stall the event loop once per request), the produce
handler appends (a plain write), then awaits `GroupCommit.durable(logs)`. One worker thread fsyncs
every log appended to since its last round and releases all the requests that were waiting for
it; requests arriving meanwhile join the next round. The event loop keeps serving fetches and
other connections while the disk works.

Rounds start at most every `min_interval_s` (`--group-commit-interval-ms`, 10 ms): under load the
requests of that interval share one round, and each log one fsync, instead of a round (an executor
hand-off and an fsync per log, ~65 µs of CPU each on ext4) per request; a request after a quiet
spell starts its round at once, so light load waits for nothing but its own fsync. At 1,000 steps/s
through the stack the broker spent 4.5 s of CPU per 20 s with a round per request, 4.0 s with this,
and 3.9 s with no fsync at all.

Owns only the scheduling of flushes; what a flush does is `PartitionLog.flush()` (storage layer).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)


class GroupCommit:
    """Batches fsyncs of partition logs in one background thread. Runs on the broker's loop."""

    def __init__(self, min_interval_s: float = 0.0) -> None:
        self.min_interval_s = min_interval_s
        self._pending: dict[int, object] = {}  # id(log) -> log, appended since the last round
        self._waiters: list[asyncio.Future] = []
        self._wakeup: asyncio.Event | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="broker-fsync")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def durable(self, logs: Iterable) -> None:
        """Return once everything appended to `logs` before this call is on disk."""
        future = asyncio.get_running_loop().create_future()
        self.schedule(logs)
        self._waiters.append(future)
        await future

    def schedule(self, logs: Iterable) -> None:
        """Flush `logs` in the next round without waiting (acks=0)."""
        for partition_log in logs:
            self._pending[id(partition_log)] = partition_log
        self._wakeup.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last_round = float("-inf")
        while True:
            await self._wakeup.wait()
            wait = self.min_interval_s - (loop.time() - last_round)
            if wait > 0:
                await asyncio.sleep(wait)  # requests of the rest of the interval join this round
            self._wakeup.clear()
            last_round = loop.time()
            logs, waiters = list(self._pending.values()), self._waiters
            self._pending, self._waiters = {}, []
            try:
                await loop.run_in_executor(self._executor, _flush, logs)
            except Exception as exc:
                log.error("fsync of %d partition log(s) failed: %s", len(logs), exc)
                _release(waiters, exc)
            else:
                _release(waiters, None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        _release(self._waiters, ConnectionAbortedError("broker shutting down"))
        self._executor.shutdown(wait=True)


def _flush(logs: list) -> None:
    for partition_log in logs:
        partition_log.flush()


def _release(waiters: list[asyncio.Future], error: Exception | None) -> None:
    for future in waiters:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

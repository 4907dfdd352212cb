"""Group commit: make appended records durable before they are acknowledged, sharing fsyncs.

With `--flush always` a produce is acknowledged only after its partition's data is fsynced. Rather
than fsync inside every append (which would stall the event loop once per request), the produce
handler appends (a plain write), then awaits `GroupCommit.durable(logs)`. One worker thread fsyncs
every log appended to since its last round and releases all the requests that were waiting for
it; requests arriving meanwhile join the next round. The event loop keeps serving fetches and
other connections while the disk works. OffsetCommit joins the rounds the same way, with the
committed-offsets file (`BrokerStore.offsets_journal`) as one more thing to flush. Under `--flush
always` what a produce hands to a round is the write-ahead file (wal.py), not its partition logs: a
round is one fsync however many partitions it touched.

Rounds start at most every `min_interval_s` (`--group-commit-interval-ms`, 10 ms): under load the
requests of that interval share one round, and each log one fsync, instead of a round (an executor
hand-off and an fsync per log, ~65 µs of CPU each on ext4) per request; a request after a quiet
spell starts its round at once, so light load waits for nothing but its own fsync. At 1,000 steps/s
through the stack the broker spent 4.5 s of CPU per 20 s with a round per request, 4.0 s with this.

The interval can adapt to the load, up to `max_interval_s` (`--group-commit-max-interval-ms`, by
default the same 10 ms, so it does not): it grows linearly with the rate of appended record bytes (a
moving average over the rounds) from the minimum at `LOW_BYTES_PER_S` to the maximum at
`HIGH_BYTES_PER_S`. A longer interval saves an fsync round, and downstream a batch of each role
waiting for its acks, per interval, and costs every hop up to its length in latency and every
producer that waits for each ack its throughput. Measured (docs/benchmarks.md, third pass): with 40
ms (and the assembler's state cache, landed with it), stack CPU per step at 1,000 steps/s 0.966 ->
0.816 ms (broker by a third, rules by a fifth), rule p50 367 -> 461 ms, the same p50 at 100 steps/s
(about 1 MB/s: the minimum applies); but the SDK flat out, which waits for each chunk's ack, 6.7k ->
2.5k steps/s. (The request rate is no measure of load: 100 steps/s made about 100 produce requests
per second, 1,000 steps/s about 170.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

LOW_BYTES_PER_S = 2_000_000  # appended bytes/s at or below which rounds wait only the minimum interval
HIGH_BYTES_PER_S = 8_000_000  # ... and at or above which they wait the maximum
RATE_SMOOTHING = 0.2  # weight of the newest round in the moving average of the append rate


class GroupCommit:
    """Batches fsyncs of partition logs in one background thread. Runs on the broker's loop."""

    def __init__(self, min_interval_s: float = 0.0, max_interval_s: float | None = None) -> None:
        self.min_interval_s = min_interval_s
        self.max_interval_s = max(min_interval_s, max_interval_s or 0.0)
        self.interval_s = min_interval_s  # the current round's: adapts between the two (see above)
        self.rate = 0.0  # appended bytes per second, a moving average over the rounds
        self._bytes = 0  # bytes appended by the requests that joined the round being gathered
        self._pending: dict[int, object] = {}  # id(log) -> log, appended since the last round
        self._waiters: list[asyncio.Future] = []
        self._wakeup: asyncio.Event | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="broker-fsync")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def durable(self, logs: Iterable, appended_bytes: int = 0) -> None:
        """Return once everything appended to `logs` before this call is on disk (`appended_bytes`:
        what the request appended, for the load the interval follows)."""
        future = asyncio.get_running_loop().create_future()
        self.schedule(logs, appended_bytes)
        self._waiters.append(future)
        await future

    def schedule(self, logs: Iterable, appended_bytes: int = 0) -> None:
        """Flush `logs` in the next round without waiting (acks=0)."""
        for partition_log in logs:
            self._pending[id(partition_log)] = partition_log
        self._bytes += appended_bytes
        self._wakeup.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last_round = float("-inf")
        while True:
            await self._wakeup.wait()
            wait = self.interval_s - (loop.time() - last_round)
            if wait > 0:
                await asyncio.sleep(wait)  # requests of the rest of the interval join this round
            self._wakeup.clear()
            now = loop.time()
            self.interval_s = self._next_interval(self._bytes, now - last_round)
            last_round = now
            logs, waiters = list(self._pending.values()), self._waiters
            self._pending, self._waiters, self._bytes = {}, [], 0
            try:
                await loop.run_in_executor(self._executor, _flush, logs)
            except Exception as exc:
                log.error("fsync of %d partition log(s) failed: %s", len(logs), exc)
                _release(waiters, exc)
            else:
                _release(waiters, None)

    def _next_interval(self, appended_bytes: int, elapsed_s: float) -> float:
        """The next round's interval, from the append rate including this round's `appended_bytes`,
        gathered over `elapsed_s` since the previous round."""
        sample = appended_bytes / max(elapsed_s, self.interval_s, 0.001)
        self.rate += RATE_SMOOTHING * (sample - self.rate)
        load = (self.rate - LOW_BYTES_PER_S) / (HIGH_BYTES_PER_S - LOW_BYTES_PER_S)
        return self.min_interval_s + min(max(load, 0.0), 1.0) * (self.max_interval_s - self.min_interval_s)

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

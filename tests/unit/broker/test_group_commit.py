"""GroupCommit (infra/broker/durability.py): fsync rounds shared by the requests of one interval."""

from __future__ import annotations

import asyncio
import threading

import pytest

from infra.broker.durability import GroupCommit


class CountingLog:
    """Stands in for a PartitionLog: counts the fsyncs asked of it (from the commit's thread)."""

    def __init__(self) -> None:
        self.flushes = 0
        self._lock = threading.Lock()

    def flush(self) -> None:
        with self._lock:
            self.flushes += 1


def test_requests_of_one_interval_share_a_round_and_a_quiet_one_waits_for_nothing():
    async def scenario():
        loop = asyncio.get_running_loop()
        commit = GroupCommit(min_interval_s=0.2)
        commit.start()
        log = CountingLog()
        try:
            started = loop.time()
            await commit.durable([log])  # after a quiet spell: synced at once
            quiet_s = loop.time() - started
            burst = [commit.durable([log]) for _ in range(20)]  # within the interval: one round
            await asyncio.gather(*burst)
            burst_s = loop.time() - started
        finally:
            await commit.close()
        return quiet_s, burst_s, log.flushes

    quiet_s, burst_s, flushes = asyncio.run(scenario())
    assert quiet_s < 0.15, "a request after a quiet spell does not wait for the interval"
    assert flushes == 2, "twenty requests in one interval share one fsync of their log"
    assert burst_s >= 0.15, "the second round started one interval after the first"


def test_no_interval_starts_a_round_as_requests_come():
    async def scenario():
        commit = GroupCommit(min_interval_s=0.0)
        commit.start()
        log = CountingLog()
        try:
            for _ in range(3):
                await commit.durable([log])
        finally:
            await commit.close()
        return log.flushes

    assert asyncio.run(scenario()) == 3


def test_the_interval_follows_the_rate_of_appended_bytes():
    commit = GroupCommit(min_interval_s=0.01, max_interval_s=0.04)
    for _ in range(40):  # 10 MB/s: the maximum
        commit.interval_s = commit._next_interval(400_000, 0.04)
    assert commit.interval_s == pytest.approx(0.04)
    for _ in range(40):  # 1 MB/s, whatever the number of requests: the minimum
        commit.interval_s = commit._next_interval(50_000, 0.05)
    assert commit.interval_s == pytest.approx(0.01)
    for _ in range(60):  # 5 MB/s: half way
        commit.interval_s = commit._next_interval(200_000, 0.04)
    assert commit.interval_s == pytest.approx(0.025, abs=0.002)
    quiet = commit._next_interval(3_000, 5.0)  # a request after a quiet spell pulls the rate down
    assert quiet < commit.interval_s


def test_sustained_load_lengthens_the_rounds_and_a_quiet_request_still_goes_at_once():
    async def scenario():
        loop = asyncio.get_running_loop()
        commit = GroupCommit(min_interval_s=0.01, max_interval_s=0.04)
        commit.start()
        log = CountingLog()
        try:
            for _ in range(30):  # rounds of eight 100 KB requests, back to back: tens of MB/s
                await asyncio.gather(*[commit.durable([log], 100_000) for _ in range(8)])
            grown = commit.interval_s
            await asyncio.sleep(0.2)  # quiet: the next request starts its round at once
            started = loop.time()
            await commit.durable([log])
            quiet_s = loop.time() - started
        finally:
            await commit.close()
        return grown, quiet_s

    grown, quiet_s = asyncio.run(scenario())
    assert grown > 0.03, "under sustained load the interval approaches its maximum"
    assert quiet_s < 0.03, "a request after a quiet spell does not wait for the grown interval"

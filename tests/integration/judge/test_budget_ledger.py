"""The shared budget and reply cache (streams/judge/ledger.py) on the real embedded broker over TCP:
two ledgers stand for two judge replicas, a third for a restarted one."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import UTC, datetime

import pytest

from streams.judge.budget import caps
from streams.judge.ledger import JudgeLedger

pytestmark = pytest.mark.integration

NOW = datetime(2026, 5, 4, 12, 30, tzinfo=UTC)
CAPS = caps(0.01, 0.05)


async def _spend(ledger: JudgeLedger, calls: int, rng: random.Random) -> list[float]:
    """Reserve 0.001 per call, 'call' for a moment, settle at 0.0004..0.001; the costs paid."""

    async def one() -> float:
        await asyncio.sleep(rng.uniform(0.0, 0.5))
        reservation = await ledger.reserve(0.001, CAPS, NOW)
        if not reservation.granted:
            return 0.0
        await asyncio.sleep(rng.uniform(0.0, 0.05))
        actual = round(rng.uniform(0.0004, 0.001), 6)
        await ledger.settle(reservation, actual)
        return actual

    return await asyncio.gather(*(one() for _ in range(calls)))


def test_two_replicas_share_one_budget_and_a_restart_keeps_it(shared_broker):
    app_id = f"ledger-{uuid.uuid4().hex[:8]}"
    rng = random.Random(7)

    async def go():
        a = JudgeLedger(shared_broker.bootstrap, app_id, cache_entries=10)
        b = JudgeLedger(shared_broker.bootstrap, app_id, cache_entries=10)
        await asyncio.gather(a.open(), b.open())
        paid_a, paid_b = await asyncio.gather(_spend(a, 25, rng), _spend(b, 25, rng))
        await asyncio.sleep(0.5)  # both read the last settlements
        books = [a.book.spent_at(NOW), b.book.spent_at(NOW)]
        await a.close()
        restarted = JudgeLedger(shared_broker.bootstrap, app_id, cache_entries=10)
        await restarted.open()
        after_restart = restarted.book.spent_at(NOW)
        late = await restarted.reserve(0.001, CAPS, NOW)
        await b.close()
        await restarted.close()
        return paid_a, paid_b, books, after_restart, late

    paid_a, paid_b, books, after_restart, late = asyncio.run(go())
    paid = sum(paid_a) + sum(paid_b)
    granted = sum(1 for p in paid_a + paid_b if p)
    # 50 concurrent calls of 0.001 against a 0.01 cap: the settlements free room for more than 10,
    # and the settled total never passes the cap
    assert 10 <= granted < 50 and any(paid_a) and any(paid_b)
    assert paid <= 0.01 + 1e-9
    assert books[0] == books[1] == after_restart  # one book, whoever reads it
    assert after_restart["hour"] == pytest.approx(paid)
    # the restarted replica keeps the window's spend: what is left is what the others left
    assert late.granted == (paid + 0.001 <= 0.01 + 1e-12)


def test_a_reply_stored_by_one_replica_is_found_by_another_and_after_a_restart(shared_broker):
    app_id = f"ledger-{uuid.uuid4().hex[:8]}"

    async def go():
        a = JudgeLedger(shared_broker.bootstrap, app_id, cache_entries=10)
        b = JudgeLedger(shared_broker.bootstrap, app_id, cache_entries=10)
        await b.open()
        await a.store_reply("k1", '{"scores": {}}')
        for _ in range(50):
            if b.replies.get("k1") is not None:
                break
            await asyncio.sleep(0.1)
        seen_by_b = b.replies.get("k1")
        await a.close()
        await b.close()
        restarted = JudgeLedger(shared_broker.bootstrap, app_id, cache_entries=10)
        await restarted.open()
        after = restarted.replies.get("k1")
        await restarted.close()
        return seen_by_b, after

    seen_by_b, after = asyncio.run(go())
    assert seen_by_b == after == '{"scores": {}}'

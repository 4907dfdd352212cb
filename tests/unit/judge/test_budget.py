"""The judge budget's pure logic (windows, reservation, settlement), the retry queue of
budget-paused requests through the processor and a restart, and the unpriced-model refusal."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone

import pytest

from streams.judge.budget import BudgetBook, SpendBudget, caps, reserve_record, settle_record, windows_at
from streams.judge.client import JudgeClient
from streams.judge.config import JudgeConfig
from streams.judge.pricing import JudgePriceError
from streams.judge.processor import JudgeProcessor
from streams.judge.rubrics import RubricCatalog
from streams.judge.selection import JudgeRule, JudgeRules
from streams.judge.state import BytesKeyed
from tests.support.judge_events import T0, trajectory
from tests.support.judge_servers.messages import MessagesServer

AT = datetime(2026, 1, 1, 10, 59, 59, 999999, tzinfo=UTC)
HOUR_END = datetime(2026, 1, 1, 11, tzinfo=UTC)
DAY_END = datetime(2026, 1, 2, tzinfo=UTC)


def test_windows_are_utc_calendar_hours_and_days():
    hour, day = windows_at(AT, {"hour": 1.0, "day": 5.0})
    assert (hour.start, hour.end, hour.cap) == (datetime(2026, 1, 1, 10, tzinfo=UTC), HOUR_END, 1.0)
    assert (day.start, day.end) == (datetime(2026, 1, 1, tzinfo=UTC), DAY_END)
    (next_hour,) = windows_at(HOUR_END, {"hour": 1.0})
    assert next_hour.start == HOUR_END and next_hour.key != hour.key
    # a local time is placed in its UTC window
    local = datetime(2026, 1, 1, 12, 30, tzinfo=timezone(timedelta(hours=2)))
    assert windows_at(local, {"hour": 1.0})[0].start == datetime(2026, 1, 1, 10, tzinfo=UTC)
    assert windows_at(AT, caps(None, None)) == []


def test_a_reservation_fits_up_to_the_cap_exactly_and_names_the_latest_blocking_window():
    book = BudgetBook()
    window_caps = caps(0.3, 0.5)
    assert book.apply(reserve_record("a", 0.1, AT, window_caps)) is None
    assert book.apply(reserve_record("b", 0.2, AT, window_caps)) is None  # 0.1 + 0.2 == 0.3 fits
    assert book.apply(reserve_record("c", 0.01, AT, window_caps)) == HOUR_END
    later = AT + timedelta(hours=1)  # a new hour, same day: the day has 0.2 left
    assert book.apply(reserve_record("d", 0.2, later, window_caps)) is None
    assert book.apply(reserve_record("e", 0.2, later, window_caps)) == DAY_END  # only the day blocks
    assert book.spent_at(AT) == pytest.approx({"hour": 0.3, "day": 0.5})


def test_settlement_replaces_the_estimate_and_unknown_or_duplicate_records_change_nothing():
    book = BudgetBook()
    window_caps = caps(1.0, None)
    book.apply(reserve_record("a", 0.4, AT, window_caps))
    book.apply(reserve_record("a", 0.4, AT, window_caps))  # a producer retry: the same record again
    assert book.spent_at(AT)["hour"] == pytest.approx(0.4)
    book.apply(settle_record("a", 0.1))
    book.apply(settle_record("a", 0.1))  # duplicate settlement
    book.apply(settle_record("nobody", 5.0))  # never reserved
    assert book.spent_at(AT)["hour"] == pytest.approx(0.1)
    assert book.apply(reserve_record("big", 0.95, AT, window_caps)) == HOUR_END
    book.apply(settle_record("big", 0.95))  # a refused reservation is never charged
    assert book.spent_at(AT)["hour"] == pytest.approx(0.1)
    book.apply(reserve_record("b", 0.2, AT, window_caps))
    book.apply(settle_record("b", 0.5))  # the real cost was above the estimate: it is charged
    assert book.spent_at(AT)["hour"] == pytest.approx(0.6)


def test_a_refusal_caused_by_open_reservations_is_waitable():
    book = BudgetBook()
    window_caps = caps(1.0, None)
    book.apply(reserve_record("a", 0.6, AT, window_caps))
    assert book.apply(reserve_record("b", 0.6, AT, window_caps)) == HOUR_END and book.waitable
    book.apply(settle_record("a", 0.5))  # settled: no longer open
    assert book.apply(reserve_record("c", 0.6, AT, window_caps)) == HOUR_END and not book.waitable
    assert book.apply(reserve_record("d", 0.5, AT, window_caps)) is None


def test_every_reader_reaches_the_same_decisions_and_caps_travel_in_the_records():
    x, y = caps(1.0, None), caps(0.5, None)  # two replicas configured differently
    records = [
        reserve_record("x1", 0.3, AT, x),
        reserve_record("y1", 0.2, AT, y),  # 0.5: fits y's cap exactly
        settle_record("x1", 0.0),
        reserve_record("y2", 0.4, AT, y),  # 0.2 + 0.4 > 0.5: refused under y's cap
        reserve_record("x2", 0.4, AT, x),  # the same total fits x's
    ]
    decisions = []
    for _reader in range(2):
        book = BudgetBook()
        decisions.append([book.apply(r) for r in records])
    assert decisions[0] == decisions[1] == [None, None, None, HOUR_END, None]


def test_ended_windows_and_their_reservations_are_forgotten():
    book = BudgetBook()
    book.apply(reserve_record("old", 0.5, AT, caps(1.0, None)))
    book.apply(reserve_record("new", 0.5, AT + timedelta(days=2), caps(1.0, None)))
    assert list(book.spent) == [windows_at(AT + timedelta(days=2), {"hour": 1})[0].key]
    assert "old" not in book.open and "old" not in book.decided


def test_a_reservation_past_its_until_still_counts_but_is_no_longer_waited_for():
    """A worker killed during its call never settles its reservation: until its call could still be
    running, a refusal it causes is `waitable`; after that the refusal is a pause. Its estimate
    stays in the spend either way (the cap holds)."""
    book = BudgetBook()
    book.apply(reserve_record("dead", 0.006, AT - timedelta(seconds=30), caps(0.01, None), hold_s=20))
    book.apply(reserve_record("running", 0.003, AT - timedelta(seconds=5), caps(0.01, None), hold_s=20))
    assert book.apply(reserve_record("later", 0.006, AT, caps(0.01, None))) == HOUR_END
    assert not book.waitable  # without "dead" it would not fit: 0.003 + 0.006 fits, waiting can't help
    assert round(book.spent_at(AT)["hour"], 6) == 0.009
    assert book.apply(reserve_record("small", 0.004, AT, caps(0.01, None))) == HOUR_END
    assert book.waitable  # 0.006 + 0.004 fits once "running" settles: worth waiting for
    book.apply(settle_record("running", 0.001))
    assert book.apply(reserve_record("fits", 0.003, AT, caps(0.01, None))) is None  # 0.006 + 0.001 + 0.003


def test_a_reservation_without_until_is_waited_for_as_before():
    book = BudgetBook()
    book.apply(reserve_record("old", 0.006, AT - timedelta(minutes=30), caps(0.01, None)))
    assert book.apply(reserve_record("new", 0.006, AT, caps(0.01, None))) == HOUR_END
    assert book.waitable


def test_a_request_refused_by_a_dead_workers_reservation_is_paused_not_stalled():
    """The worker that reserved died mid-call (its reservation is open for good): once its call can
    no longer be running, the next request is paused at once instead of waiting up to the longest
    call (5 attempts of 60 s by default) for a settlement that never comes."""
    clock = [T0 + timedelta(minutes=10)]

    async def go(server):
        processor = _processor(server, {"state": {}, "groups": {}}, clock, cap=0.007)
        budget = processor.calls.budget
        dead = await budget.reserve(0.005, hold_s=processor.calls.longest_call_s)
        assert dead.granted
        clock[0] += timedelta(seconds=processor.calls.longest_call_s + 1)
        try:
            result = await asyncio.wait_for(processor.process_events(trajectory("t", task="task")), 10)
        finally:
            await processor.client.close()
        return result.outputs

    with MessagesServer() as server:
        (paused,) = asyncio.run(go(server))
        assert server.requests == []
    assert paused.type == "reward.judge.failed" and paused.kind == "budget_paused"
    assert paused.retry_at == T0 + timedelta(hours=1)


def test_the_in_memory_budget_reserves_and_settles():
    clock = [AT]
    budget = SpendBudget(0.01, None, clock=lambda: clock[0])

    async def go():
        first = await budget.reserve(0.006)
        await budget.settle(first, 0.002)
        second = await budget.reserve(0.006)
        third = await budget.reserve(0.006)
        clock[0] = HOUR_END
        fourth = await budget.reserve(0.006)
        return first, second, third, fourth

    first, second, third, fourth = asyncio.run(go())
    assert first.granted and second.granted and third.retry_at == HOUR_END and fourth.granted


# --- the retry queue, through the processor -----------------------------------------------------


def _processor(server, stores, clock, cap: float) -> JudgeProcessor:
    config = JudgeConfig(api_key="k", base_url=server.url, budget_usd_per_hour=cap, max_tokens=256)
    rules = JudgeRules(rules=[JudgeRule(mode="trajectory")])
    budget = SpendBudget(cap, None, clock=lambda: clock[0])
    processor = JudgeProcessor(
        config, rules, RubricCatalog(), JudgeClient(config), budget=budget, now=lambda: clock[0]
    )
    processor.bind(BytesKeyed(stores["state"]), BytesKeyed(stores["groups"]))
    return processor


def _commit(stores, result) -> None:
    """What the shell does after publishing: the table updates into the stores."""
    for table, updates in result.tables.items():
        for key, value in updates.items():
            if value is None:
                stores[table].pop(key, None)
            else:
                stores[table][key] = value


def test_paused_targets_are_judged_when_the_window_reopens_also_after_a_restart():
    stores = {"state": {}, "groups": {}}
    clock = [T0 + timedelta(minutes=10)]
    events = [*trajectory("fits", task="task one"), *trajectory("waits", task="task two")]

    async def go(server):
        out = {}
        p1 = _processor(server, stores, clock, cap=0.007)
        result = await p1.process_events(events)
        _commit(stores, result)
        out["first"] = result.outputs
        clock[0] = T0 + timedelta(minutes=59)
        out["early"] = (await p1.flush_stale_steps()).outputs  # not due yet
        await p1.client.close()
        # a restart in the next hour with a budget too small for anything: paused again, later
        clock[0] = T0 + timedelta(hours=1, seconds=1)
        p2 = _processor(server, stores, clock, cap=0.0001)
        result = await p2.flush_stale_steps()
        _commit(stores, result)
        out["again"] = result.outputs
        await p2.client.close()
        clock[0] = T0 + timedelta(hours=2, seconds=1)  # another restart, the window reopened
        p3 = _processor(server, stores, clock, cap=0.007)
        result = await p3.flush_stale_steps()
        _commit(stores, result)
        out["judged"] = result.outputs
        out["after"] = (await p3.flush_stale_steps()).outputs
        await p3.client.close()
        return out

    with MessagesServer() as server:
        out = asyncio.run(go(server))
        requests = len(server.requests)
    scored, paused = out["first"]
    assert scored.trajectory_id == "fits" and scored.type == "reward.judge.trajectory"
    assert paused.trajectory_id == "waits" and paused.kind == "budget_paused"
    assert paused.retry_at == T0 + timedelta(hours=1) and out["early"] == []
    (again,) = out["again"]
    assert again.kind == "budget_paused" and again.retry_at == T0 + timedelta(hours=2)
    assert again.event_id != paused.event_id  # a new fact (a later retry_at), not a duplicate
    (judged,) = out["judged"]
    assert judged.type == "reward.judge.trajectory" and judged.trajectory_id == "waits"
    assert judged.scores and judged.cost_usd > 0
    assert out["after"] == [] and b'"paused"' not in stores["state"][b"waits"]
    assert requests == 2  # "fits" once, "waits" once: the pauses cost nothing
    # the score has the id a judgment without any pause would have had
    with MessagesServer() as server:
        config = JudgeConfig(api_key="k", base_url=server.url, max_tokens=256)
        plain = JudgeProcessor(
            config, JudgeRules(rules=[JudgeRule(mode="trajectory")]), RubricCatalog(), JudgeClient(config)
        )

        async def unpaused():
            result = await plain.process_events(trajectory("waits", task="task two"))
            await plain.client.close()
            return result.outputs

        assert [e.event_id for e in asyncio.run(unpaused())] == [judged.event_id]


# --- prices -------------------------------------------------------------------------------------


def _make(**cfg) -> JudgeProcessor:
    config = JudgeConfig(api_key="k", **cfg)
    return JudgeProcessor(config, JudgeRules(), RubricCatalog(), JudgeClient(config))


def test_an_unpriced_model_refuses_to_start_with_a_budget_unless_its_price_is_given():
    with pytest.raises(JudgePriceError) as info:
        _make(model="acme-judge-1", budget_usd_per_day=5.0)
    message = str(info.value)
    assert "'acme-judge-1' has no price" in message and "AGENTSTREAM_JUDGE_PRICES" in message
    _make(model="acme-judge-1")  # no budget: allowed (its cost shows as 0)
    _make(
        model="acme-judge-1",
        budget_usd_per_day=5.0,
        prices={"acme-judge-1": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}},
    )
    _make(model="claude-sonnet-4-5-20250929", budget_usd_per_hour=1.0)  # a dated id: family price

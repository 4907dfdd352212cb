"""The judge's shared budget and reply cache are named after the live judge, not after the app id a
judge runs under (issue #17): a replay's judge (app id `agentstream-replay-...-judge`) reads the
live judge's cache and spends from its budget."""

from __future__ import annotations

import doctest
from types import SimpleNamespace

from streams.config import WorkerConfig
from streams.judge import ledger
from streams.judge.ledger import LEDGER_PREFIX, SharedBudget, SharedReplyCache, share_state


def test_the_module_examples_hold():
    assert doctest.testmod(ledger).failed == 0


def test_the_workers_default_prefix_is_the_live_judges_app_id():
    config = WorkerConfig(roles=("judge",))
    assert config.ledger_prefix == LEDGER_PREFIX == config.app_id("judge")


def _faust_app(app_id: str):
    connected = []
    return SimpleNamespace(
        conf=SimpleNamespace(id=app_id, broker=[SimpleNamespace(host="127.0.0.1", port=9092)]),
        on_before_shutdown=SimpleNamespace(connect=lambda fn, weak: connected.append(fn)),
    )


def _processor():
    return SimpleNamespace(
        config=SimpleNamespace(cache_entries=10, budget_usd_per_hour=1.0, budget_usd_per_day=None),
        calls=SimpleNamespace(budget=None, cache=None),
    )


def test_a_replays_judge_uses_the_live_judges_topics():
    replay = WorkerConfig(roles=("judge",), app_prefix="agentstream-replay-rules-2-20260101T000000")
    processor = _processor()
    shared = share_state(_faust_app(replay.app_id("judge")), processor, replay.ledger_prefix)
    assert (shared.budget_topic, shared.cache_topic) == (
        "agentstream-judge-budget",
        "agentstream-judge-cache",
    )
    assert isinstance(processor.calls.budget, SharedBudget) and isinstance(
        processor.calls.cache, SharedReplyCache
    )


def test_another_prefix_keeps_a_separate_budget_and_cache():
    shared = share_state(_faust_app("agentstream-judge"), _processor(), "team-b-judge")
    assert (shared.budget_topic, shared.cache_topic) == ("team-b-judge-budget", "team-b-judge-cache")
    assert share_state(_faust_app("x-judge"), _processor()).cache_topic == "agentstream-judge-cache"

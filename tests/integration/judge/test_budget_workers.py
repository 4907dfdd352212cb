"""Acceptance for issue #17: two judge worker processes and a restart of one of them share ONE
spend budget (embedded broker over TCP, the local Messages-API server charging by tokens, the real
anthropic SDK); budget-paused targets are judged once the window reopens, after a restart."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from clients.kafka import ensure_topics
from schemas.codec import decode, encode, encode_key
from schemas.topics import AGENT_EVENTS, REWARD_JUDGE
from tests.support.judge_budget import ChargingServer, replica
from tests.support.judge_events import trajectory
from tests.support.processes import wait_for

pytestmark = pytest.mark.integration

CAP = 0.02  # USD per hour; a call here costs about 0.002 and reserves about 0.005
PRICE = (3.0, 15.0)  # claude-sonnet-4-6, USD per Mtok (the default price table)


def _produce(bootstrap: str, events) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for event in events:
        producer.send(AGENT_EVENTS, key=encode_key(event), value=encode(event))
    producer.flush()
    producer.close()


class JudgeEvents:
    def __init__(self, bootstrap: str):
        from kafka import KafkaConsumer

        self.consumer = KafkaConsumer(
            REWARD_JUDGE, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
        )
        self.by_id: dict = {}

    def poll(self) -> dict:
        for records in self.consumer.poll(timeout_ms=200).values():
            for record in records:
                event = decode(record.value)
                seen = self.by_id.get(event.event_id)
                # a batch replayed after a rebalance republishes an id, from the cache (cost 0):
                # keep the copy that says what was paid
                if seen is None or event.cost_usd > seen.cost_usd:
                    self.by_id[event.event_id] = event
        return self.by_id

    def answered(self, tids) -> bool:
        got = {e.trajectory_id for e in self.poll().values()}
        return set(tids) <= got

    def scored(self) -> dict:
        return {e.trajectory_id: e for e in self.poll().values() if e.type == "reward.judge.trajectory"}

    def paused(self) -> list:
        events = self.poll().values()
        return [e for e in events if e.type == "reward.judge.failed" and e.kind == "budget_paused"]


def test_two_replicas_and_a_restart_stay_within_one_budget_and_paused_targets_are_judged_later(
    broker, tmp_path
):
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: all\n    mode: trajectory\n")
    ensure_topics(broker.bootstrap)
    now = datetime.now(UTC)
    offset = (now.replace(minute=5, second=0, microsecond=0) - now).total_seconds()  # hh:05 for ~55 min
    first = [f"b1-{n}" for n in range(6)]
    second = [f"b2-{n}" for n in range(8)]
    with ChargingServer(latency_s=0.3) as server:
        env = {
            "ANTHROPIC_API_KEY": "dummy-key",
            "AGENTSTREAM_JUDGE_BASE_URL": server.url,
            "AGENTSTREAM_JUDGE_BUDGET_USD_PER_HOUR": str(CAP),
            "AGENTSTREAM_JUDGE_MAX_TOKENS": "200",
            "AGENTSTREAM_JUDGE_STEP_WAIT_S": "4",  # the retry timer ticks every second
            # a call takes at most 2 x 5 s: a reservation left open by the replica killed during its
            # call stops being waited for after that, and the others pause instead of stalling
            "AGENTSTREAM_JUDGE_TIMEOUT_S": "5",
            "AGENTSTREAM_JUDGE_MAX_ATTEMPTS": "2",
        }

        def start(name: str, clock_offset: float):
            return replica(
                broker.bootstrap, tmp_path / name, rules, tmp_path / f"{name}.log", env, clock_offset
            )

        events = JudgeEvents(broker.bootstrap)
        a, b = start("a", offset), start("b", offset)
        try:
            _produce(broker.bootstrap, [e for t in first for e in trajectory(t, task=f"task {t}")])
            wait_for(lambda: events.answered(first), 120, what=f"batch 1 judged\n{a.log_text()[-3000:]}")
            a.kill9()  # a crash of one replica under the budget
            a = start("a2", offset)
            _produce(broker.bootstrap, [e for t in second for e in trajectory(t, task=f"task {t}")])
            wait_for(lambda: events.answered(second), 120, what=f"batch 2 judged\n{a.log_text()[-3000:]}")
            window1 = dict(events.poll())
            billed1 = server.billed_usd(*PRICE)
            # the next hour: both replicas restarted with their clocks one hour on
            a.stop()
            b.stop()
            a, b = start("a3", offset + 3600), start("b3", offset + 3600)
            paused = {e.trajectory_id for e in window1.values() if e.type == "reward.judge.failed"}
            wait_for(
                lambda: paused <= set(events.scored()),
                120,
                what=f"paused targets judged in the next window\n{a.log_text()[-3000:]}",
            )
            every = dict(events.poll())
        finally:
            a.stop()
            b.stop()
            events.consumer.close()
        billed_total = server.billed_usd(*PRICE)

    scored1 = {e.trajectory_id for e in window1.values() if e.type == "reward.judge.trajectory"}
    assert scored1 and paused and scored1 | paused == set(first + second)
    failed = [e for e in window1.values() if e.type != "reward.judge.trajectory"]
    assert all(e.kind == "budget_paused" and e.retry_at.minute == 0 for e in failed)
    spent1 = sum(e.cost_usd for e in window1.values())
    assert 0 < spent1 <= CAP and 0 < billed1 <= CAP  # two replicas and a restart: one cap
    # what events say was paid is what the server billed (less a call made twice by two replicas
    # around a rebalance, which has one event id)
    assert spent1 <= billed1 + 1e-9 and spent1 >= billed1 - 2 * max(e.cost_usd for e in window1.values())
    later = [e for i, e in every.items() if i not in window1 and e.type == "reward.judge.trajectory"]
    assert {e.trajectory_id for e in later} == paused  # the paused ones, judged now
    assert 0 < sum(e.cost_usd for e in later) <= CAP and billed_total - billed1 <= CAP

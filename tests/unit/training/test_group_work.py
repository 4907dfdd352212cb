"""Rank 0 handing batches to the other ranks (consumers.training.group_work), with a fake executor
and the broadcast replaced by a script of items: what is trained, what is skipped, what stops a rank,
and which failures the follow loop dead-letters (a refusal) or raises (a broken group)."""

from __future__ import annotations

import time

import pytest

from clients.kafka.consume import refusal
from consumers.errors import TrainerError
from consumers.training import group_work
from consumers.training.distributed import Ranks
from consumers.training.group_work import GroupBroken, LeadExecutor, follow_lead
from consumers.training.versions import TrainState
from tests.support.processes import wait_for

RANK1 = Ranks(rank=1, world_size=2, local_rank=1)


class FakeExecutor:
    def __init__(self, fail: Exception | None = None):
        self.state, self.fail, self.trained = TrainState(), fail, []
        self.config = "the executor's config"

    def train_batch(self, rows, method, batch_id, *, source_ranges=None):
        if self.fail is not None:
            raise self.fail
        self.trained.append((batch_id, method, len(rows), source_ranges))
        self.state.next_version(batch_id)
        return f"event of {batch_id}"


def _script(monkeypatch, items):
    sent, queue = [], list(items)

    def broadcast(ranks, obj):
        if ranks.is_main:
            sent.append(obj)
            return obj
        return queue.pop(0)

    monkeypatch.setattr(group_work, "broadcast_object", broadcast)
    return sent


def _item(batch_id, from_version=None, rows=2):
    return {"kind": "train", "rows": [{"i": i} for i in range(rows)], "method": "sft",
            "batch_id": batch_id, "source_ranges": {"t": [0, 1]}, "from_version": from_version}  # fmt: skip


def test_the_lead_sends_each_batch_before_training_it_and_stops_the_others(monkeypatch):
    sent = _script(monkeypatch, [])
    executor = FakeExecutor()
    lead = LeadExecutor(executor, Ranks(rank=0, world_size=2))
    assert lead.train_batch([{"i": 0}], "sft", "b1", source_ranges={"t": [0, 1]}) == "event of b1"
    lead.train_batch([{"i": 0}], "sft", "b2")
    lead.stop_others()
    assert [s["kind"] for s in sent] == ["train", "train", "stop"]
    assert [s.get("from_version") for s in sent[:2]] == [None, "v1"]  # the version it trains from
    assert lead.state is executor.state and lead.config == "the executor's config"


def test_another_rank_trains_what_rank_0_sends_until_stop(monkeypatch):
    _script(monkeypatch, [_item("b1"), _item("b2", "v1", rows=3), {"kind": "stop"}])
    executor = FakeExecutor()
    assert follow_lead(executor, RANK1) == 0
    assert executor.trained == [("b1", "sft", 2, {"t": [0, 1]}), ("b2", "sft", 3, {"t": [0, 1]})]


def test_a_rank_behind_rank_0s_version_refuses_to_train(monkeypatch):
    _script(monkeypatch, [_item("b2", "v1")])  # rank 0 is at v1, this rank's checkpoint says nothing
    with pytest.raises(TrainerError, match="resumed at version None but rank 0 trains from 'v1'"):
        follow_lead(FakeExecutor(), RANK1)


def test_an_unknown_item_stops_the_rank(monkeypatch):
    _script(monkeypatch, [{"kind": "reboot"}])
    with pytest.raises(TrainerError, match="work item kind 'reboot'"):
        follow_lead(FakeExecutor(), RANK1)


def test_a_refused_batch_is_skipped_by_the_other_ranks_but_a_crash_is_not(monkeypatch):
    _script(monkeypatch, [_item("b1"), {"kind": "stop"}])
    assert follow_lead(FakeExecutor(fail=TrainerError("all rows over --max-length")), RANK1) == 0
    _script(monkeypatch, [_item("b1"), {"kind": "stop"}])
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        follow_lead(FakeExecutor(fail=RuntimeError("Connection closed by peer")), RANK1)


def test_a_broken_group_is_not_dead_lettered_but_a_refusal_is(monkeypatch):
    _script(monkeypatch, [])
    broken = LeadExecutor(FakeExecutor(fail=RuntimeError("gloo: Connection reset by peer")), Ranks(0, 2, 0))
    with pytest.raises(GroupBroken, match="b1 in a group of 2 failed") as caught:
        broken.train_batch([{"i": 0}], "sft", "b1")
    assert refusal(caught.value, "cannot train") is None  # the loop raises it: the offset is kept
    refused = LeadExecutor(FakeExecutor(fail=TrainerError("all rows over")), Ranks(0, 2, 0))
    with pytest.raises(TrainerError) as caught:
        refused.train_batch([{"i": 0}], "sft", "b1")
    assert not isinstance(caught.value, GroupBroken)
    assert refusal(caught.value, "cannot train") is not None  # dead-lettered with its coordinates


def test_idle_items_are_skipped_by_the_other_ranks(monkeypatch):
    idle = {"kind": "idle"}
    _script(monkeypatch, [idle, _item("b1"), idle, idle, {"kind": "stop"}])
    executor = FakeExecutor()
    assert follow_lead(executor, RANK1) == 0
    assert [t[0] for t in executor.trained] == ["b1"]


class SlowExecutor(FakeExecutor):
    def __init__(self, sent: list, seconds: float):
        super().__init__()
        self.sent, self.seconds, self.seen = sent, seconds, []

    def train_batch(self, rows, method, batch_id, *, source_ranges=None):
        before = len(self.sent)
        time.sleep(self.seconds)  # longer than the keepalive interval
        self.seen.append((before, len(self.sent)))
        return super().train_batch(rows, method, batch_id, source_ranges=source_ranges)


def test_the_keepalive_sends_idle_items_only_while_rank_0_has_no_work(monkeypatch):
    sent = _script(monkeypatch, [])
    executor = SlowExecutor(sent, seconds=0.5)
    lead = LeadExecutor(executor, Ranks(rank=0, world_size=2)).start_keepalive(interval_s=0.05)
    try:
        wait_for(lambda: lead.idle_sent >= 2, timeout_s=10, what="two idle items")
        lead.train_batch([{"i": 0}], "sft", "b1")
        assert executor.seen == [(executor.seen[0][0],) * 2]  # nothing went out while it trained
        assert sent[executor.seen[0][0] - 1]["kind"] == "train"
        wait_for(lambda: sent[-1]["kind"] == "idle", timeout_s=10, what="idle items again")
        lead.stop_others()
        stopped_at = len(sent)
        time.sleep(0.3)
        assert len(sent) == stopped_at and sent[-1] == {"kind": "stop"}  # nothing after the stop
    finally:
        lead.close()
    assert not lead._keepalive.is_alive()


def test_a_failed_idle_item_breaks_the_next_batch_not_the_loop(monkeypatch):
    def broadcast(ranks, obj):
        raise RuntimeError("gloo: Connection closed by peer")

    monkeypatch.setattr(group_work, "broadcast_object", broadcast)
    lead = LeadExecutor(FakeExecutor(), Ranks(rank=0, world_size=2)).start_keepalive(interval_s=0.02)
    wait_for(lambda: not lead._keepalive.is_alive(), timeout_s=10, what="the keepalive to stop")
    with pytest.raises(GroupBroken, match="Connection closed by peer"):
        lead.train_batch([{"i": 0}], "sft", "b1")
    lead.close()

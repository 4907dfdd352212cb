"""Backpressure: pause while more than `max_staleness` batches wait for training, one log line per
pause, resume when the trainer catches up; an unreadable backlog never blocks sampling."""

from __future__ import annotations

import logging

import pytest

from producers.rollout.backpressure import Backlog, BackpressureGate, should_pause, staleness


@pytest.mark.parametrize(
    ("batches", "updates", "limit", "paused"),
    [(5, 2, 2, True), (4, 2, 2, False), (2, 5, 1, False), (100, 0, 0, False), (3, 0, 2, True)],
)
def test_the_decision(batches, updates, limit, paused):
    assert should_pause(batches, updates, limit) is paused
    assert staleness(batches, updates) == max(0, batches - updates)


class Backlogs:
    def __init__(self, *values):
        self.values = list(values)

    def read(self) -> Backlog:
        value = self.values.pop(0) if len(self.values) > 1 else self.values[0]
        if isinstance(value, Exception):
            raise value
        return Backlog(*value)


def test_the_gate_waits_until_the_trainer_catches_up_and_logs_once(caplog):
    sleeps: list[float] = []
    gate = BackpressureGate(
        Backlogs((6, 1), (6, 2), (6, 3), (6, 4)), max_staleness=2, poll_s=0.5, sleep=sleeps.append
    )
    with caplog.at_level(logging.INFO, logger="producers.rollout.backpressure"):
        gate.wait()
    assert sleeps == [0.5, 0.5, 0.5] and not gate.paused and gate.pauses == 1
    paused = [r.getMessage() for r in caplog.records if "paused" in r.getMessage()]
    assert paused == [
        "rollout: paused, trainer 5 batches behind (max_staleness 2), "
        "0 episodes since its last batch (max_ahead 0)"
    ]


def test_off_or_unreadable_never_blocks():
    BackpressureGate(Backlogs(RuntimeError("no broker")), max_staleness=0, sleep=pytest.fail).wait()
    gate = BackpressureGate(Backlogs(RuntimeError("no broker")), max_staleness=1, sleep=pytest.fail)
    gate.wait()
    assert not gate.paused


def test_max_ahead_pauses_after_n_episodes_until_the_executor_finishes_a_batch():
    """Before the first batch exists the staleness count is 0: only max_ahead bounds the sampling."""
    sleeps: list[float] = []
    backlog = Backlogs((0, 0))
    gate = BackpressureGate(backlog, max_staleness=2, poll_s=1.0, sleep=sleeps.append, max_ahead=3)
    for _ in range(3):
        gate.wait()
    assert sleeps == [] and not gate.paused
    backlog.values = [(0, 0), (0, 0), (1, 1)]  # the executor finishes a batch on the third read
    gate.wait()
    assert sleeps == [1.0, 1.0] and gate.pauses == 1 and not gate.paused
    gate.wait()
    gate.wait()  # the allowance is 3 again: one used by the wait that resumed, two more
    assert sleeps == [1.0, 1.0]


def test_max_ahead_alone_turns_the_gate_on():
    gate = BackpressureGate(Backlogs((0, 0)), max_staleness=0, sleep=lambda _: None, max_ahead=1)
    gate.wait()
    assert gate.check() is True

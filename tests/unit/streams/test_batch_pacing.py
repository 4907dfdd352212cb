"""BatchPacing (streams/batch.py): a role waits after a batch only under load, by up to its period
measured from the batch's start; at a trickle it takes each fetch as it comes."""

from __future__ import annotations

import pytest

from streams.batch import BatchPacing


def _run(pacing: BatchPacing, events: int, period_s: float, batches: int, busy_s: float = 0.002) -> float:
    """`batches` batches of `events`, one every `period_s`; returns the last pause."""
    pause, now = 0.0, 100.0
    for _ in range(batches):
        pause = pacing.pause(events, now, now + busy_s)
        now += period_s
    return pause


def test_no_pause_at_a_trickle_and_the_full_period_under_load():
    assert _run(BatchPacing(0.04), events=2, period_s=0.02, batches=50) == 0.0  # 100 events/s
    under_load = BatchPacing(0.04)
    assert _run(under_load, events=80, period_s=0.04, batches=50) == pytest.approx(0.038)  # 2,000/s
    assert under_load.rate == pytest.approx(2_000, rel=0.01)


def test_the_pause_grows_with_the_rate_between_the_two_thresholds():
    half = BatchPacing(0.04)
    assert _run(half, events=32, period_s=0.04, batches=80, busy_s=0.0) == pytest.approx(0.02, abs=0.001)


def test_a_batch_that_took_its_period_already_waits_no_more_and_zero_turns_it_off():
    pacing = BatchPacing(0.04)
    _run(pacing, events=80, period_s=0.04, batches=50)
    assert pacing.pause(80, 200.0, 200.05) == 0.0
    assert _run(BatchPacing(0.0), events=500, period_s=0.01, batches=20) == 0.0

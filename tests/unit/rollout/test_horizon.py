"""The horizon schedule: its one string form, monotone growth clamped to its first and last stage,
and errors that name the bad value."""

from __future__ import annotations

import pytest

from producers.errors import ProducerError
from producers.rollout.horizon import HorizonSchedule, parse_horizon


def test_stages_apply_from_their_step_and_clamp_at_both_ends():
    schedule = HorizonSchedule.parse("0=4, 100=8,200=16")
    assert schedule.stages == ((0, 4), (100, 8), (200, 16))
    assert [schedule.horizon_at(k) for k in (-5, 0, 99, 100, 199, 200, 10**9)] == [4, 4, 4, 8, 8, 16, 16]
    assert (schedule.initial, schedule.final) == (4, 16)


def test_before_the_first_stage_its_turns_apply():
    schedule = HorizonSchedule.parse("50=6,80=9")
    assert [schedule.horizon_at(k) for k in (0, 49, 50, 80)] == [6, 6, 6, 9]


def test_growth_is_monotone():
    schedule = HorizonSchedule.parse("0=2,10=3,20=3,40=12")
    limits = [schedule.horizon_at(k) for k in range(0, 100)]
    assert limits == sorted(limits) and min(limits) == 2 and max(limits) == 12


def test_empty_means_no_schedule():
    assert parse_horizon("") is None and parse_horizon("  ") is None
    assert parse_horizon("0=4").horizon_at(5) == 4


@pytest.mark.parametrize("text", ["8:+2@50:32", "4", "0=x", "0=4,,5=6", "a=1"])
def test_a_bad_string_is_named_in_the_error(text):
    with pytest.raises(ProducerError, match="--horizon") as error:
        HorizonSchedule.parse(text)
    assert repr(text) in str(error.value)


@pytest.mark.parametrize(
    ("text", "why"),
    [("0=8,10=4", "never decrease"), ("10=4,5=8", "increasing"), ("0=0", ">= 1"), ("-1=4", ">= 0")],
)
def test_stages_must_grow(text, why):
    with pytest.raises(ProducerError, match=why):
        HorizonSchedule.parse(text)

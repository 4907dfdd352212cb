"""Offset continuity (streams/offsets.py): a record the worker never received is reported as a gap."""

from __future__ import annotations

from streams.offsets import OffsetContinuity, OffsetGap

T = "agent.events"


def committed_at(offsets: dict[tuple[str, int], int]):
    return lambda topic, partition: offsets.get((topic, partition))


def test_contiguous_offsets_and_redeliveries_are_no_gap():
    guard = OffsetContinuity()
    committed = committed_at({(T, 0): 10})
    assert guard.check([(1, T, 0, 10), (1, T, 0, 11), (1, T, 1, 0)], committed) == []
    assert guard.check([(1, T, 0, 12), (1, T, 0, 10), (1, T, 0, 11), (1, T, 0, 13)], committed) == []


def test_a_first_record_past_the_committed_offset_is_a_gap():
    guard = OffsetContinuity()
    gaps = guard.check([(3, T, 0, 11), (3, T, 0, 12)], committed_at({(T, 0): 10}))
    assert gaps == [OffsetGap(T, 0, 10, 11)]
    assert gaps[0].describe() == "agent.events[0] offsets 10 (next delivered: 11)"


def test_a_hole_inside_a_partition_is_a_gap_and_names_the_range():
    guard = OffsetContinuity()
    gaps = guard.check([(1, T, 2, 5), (1, T, 2, 6), (1, T, 2, 9)], committed_at({}))
    assert gaps == [OffsetGap(T, 2, 7, 9)]
    assert gaps[0].describe() == "agent.events[2] offsets 7..8 (next delivered: 9)"


def test_unknown_committed_offset_accepts_the_first_record():
    guard = OffsetContinuity()
    assert guard.check([(1, T, 0, 40)], committed_at({})) == []


def test_a_new_generation_starts_again_from_the_committed_offset():
    guard = OffsetContinuity()
    assert guard.check([(1, T, 0, 0), (1, T, 0, 1)], committed_at({})) == []
    # after a rebalance another worker processed 2..49 and committed 50
    assert guard.check([(2, T, 0, 50)], committed_at({(T, 0): 50})) == []
    assert guard.check([(3, T, 0, 60)], committed_at({(T, 0): 55})) == [OffsetGap(T, 0, 55, 60)]

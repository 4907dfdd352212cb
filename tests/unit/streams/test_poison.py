"""Poison input to the stream roles' batch logic (issue #34): state bounded by what arrived, never by
what a field claims, and a record that makes processing raise is dead-lettered with its coordinates."""

from __future__ import annotations

import time
import tracemalloc

from schemas import topics
from schemas.codec import encode
from schemas.records import Record
from streams.assembler.assembly import Assembly
from streams.assembler.processor import TrajectoryAssembler
from streams.assembler.reward_math import Calibrations
from streams.assembler.slots import absent_slots
from streams.batch import BatchResult, is_retryable
from streams.rules.processor import RuleRewarder
from streams.rules.profiles import ProfileRegistry
from streams.scoring.processor import Scoring
from tests.support.streams_events import REG, trajectory

HUGE_INDEX = 2**32
HUGE_TOTAL = 10**8


def _claiming(index: int, total: int):
    """A trajectory whose last step claims `index` and whose end claims `total` steps; built with
    `model_copy` (no validation), as a record that bypassed the contract would arrive."""
    started, steps, ended, rewards = trajectory()
    far = steps[-1].model_copy(update={"step_index": index, "event_id": "far"})
    return [started, *steps, far, ended.model_copy(update={"total_steps": total}), *rewards]


def test_a_claimed_step_index_or_total_costs_what_arrived_not_what_it_claims():
    events = _claiming(HUGE_INDEX, HUGE_TOTAL)
    a = Assembly()
    tracemalloc.start()
    started = time.perf_counter()
    for e in events:
        a.add(e, 0.0)
    missing, absent, structure = a.missing(), a.absent(), a.structure_missing()
    try:  # the contract may refuse the claimed index in the output: then the role dead-letters it
        emitted = a.decide("t", REG, Calibrations(), now=1_000.0, grace_s=30.0)
    except ValueError:
        emitted = None
    elapsed = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # the old code built one string per claimed step: 10**8 of them (gigabytes, minutes)
    assert elapsed < 2.0 and peak < 4_000_000, (elapsed, peak)
    assert missing == absent == structure
    assert "step.recorded[3..99999999]" in missing and "reward.rule.step[3..99999999]" in missing
    assert len(missing) < 10
    assert emitted is None or (not emitted.complete and emitted.missing == missing)


def test_absent_slots_are_listed_one_by_one_up_to_the_cap_then_as_ranges():
    assert absent_slots("s", 3, []) == ["s[0]", "s[1]", "s[2]"]
    assert absent_slots("s", 10**9, range(0, 300, 2), listed=100)[-2:] == ["s[297]", "s[299..999999999]"]
    assert len(absent_slots("s", 10**9, range(0, 300, 2), listed=100)) <= 100 + 151
    assert absent_slots("s", 3, [5, -1, 0, 1, 2]) == []  # indexes outside 0..n-1 claim nothing


def test_the_scoring_role_on_a_claimed_index_stays_small(tmp_path):
    """Through the role's batch logic, from records: whatever the contract says of 2**32 (refused at
    decode, or accepted), the batch finishes fast, in bounded memory, and stores a small state."""
    processor = Scoring(RuleRewarder(ProfileRegistry()), TrajectoryAssembler(ProfileRegistry(), 30.0))
    events = _claiming(HUGE_INDEX, HUGE_TOTAL)
    records = [
        Record(topics.AGENT_EVENTS, 0, i, e.trajectory_id.encode(), encode(e))
        for i, e in enumerate(e for e in events if e.type != "reward.rule.step")
    ]
    tracemalloc.start()
    result = processor.process(records, get_rules=lambda _k: None, get_state=lambda _k: None)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8_000_000, peak
    assert all(len(raw or b"") < 100_000 for table in result.tables.values() for raw in table.values())
    for letter in result.dead:  # refused by the contract: named with its coordinates
        assert letter.source_topic == topics.AGENT_EVENTS and letter.source_offset is not None


def test_a_record_that_decoding_chokes_on_is_a_dead_letter_not_an_exception():
    """JSON nested past the parsers' own limits: whatever decoding raises becomes a dead letter."""
    _, steps, _, _ = trajectory()
    good = encode(steps[0])
    deep = good[:-1] + b',"params":{"a":' + b"[" * 1000 + b"]" * 1000 + b"}}"
    records = [Record(topics.AGENT_EVENTS, 1, 7, b"t", deep), Record(topics.AGENT_EVENTS, 1, 8, b"t", good)]
    result = RuleRewarder(ProfileRegistry()).process(records, lambda _k: None)
    assert [(d.source_partition, d.source_offset) for d in result.dead] == [(1, 7)]


def test_failures_of_the_world_are_retryable_and_failures_of_a_record_are_not():
    from kafka.errors import KafkaTimeoutError

    from streams.judge.ledger import JudgeLedgerError

    assert is_retryable(KafkaTimeoutError()) and is_retryable(JudgeLedgerError("x"))
    assert is_retryable(OSError("disk")) and not is_retryable(RecursionError("deep"))
    assert not is_retryable(ValueError("bad value")) and isinstance(BatchResult().dead, list)


def test_a_timer_output_no_message_can_hold_is_dead_lettered_and_the_rest_published():
    """A grace timer emits from no record: an oversized trajectory.scored must not make the tick
    raise (the role would exit and loop on it), it goes to the DLQ as a bounded summary."""
    from schemas.events import ScoredStep, TrajectoryScored, utc_now
    from schemas.limits import MAX_DEAD_LETTER_PAYLOAD_BYTES, MAX_EVENT_BYTES
    from streams.batch import BatchResult
    from streams.shell import timer_outputs_that_fit

    def scored(tid: str, text: str) -> TrajectoryScored:
        steps = [ScoredStep(step_index=i, observation=text) for i in range(3)]
        common = {"event_id": tid, "trajectory_id": tid, "occurred_at": utc_now(), "producer": "t"}
        return TrajectoryScored(task_id="k", steps=steps, **common)

    big, small = scored("big", "x" * 400_000), scored("small", "ok")
    result = timer_outputs_that_fit("scoring", BatchResult(outputs=[big, small]))
    assert [e.trajectory_id for e in result.outputs] == ["small"]
    [letter] = result.dead
    assert letter.trajectory_id == "big" and letter.error_type == "OutputTooLarge"
    assert letter.payload_truncated and letter.payload_bytes > MAX_EVENT_BYTES
    assert len(letter.payload.encode()) <= MAX_DEAD_LETTER_PAYLOAD_BYTES

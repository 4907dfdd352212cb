"""Trajectory assembly (pure): completeness, totals, out-of-order, duplicates, grace, revisions,
judge expectations and calibration."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import timedelta

from schemas.events import (
    FeedbackAnnotation,
    JudgeFailed,
)
from streams.assembler.assembly import Assembly
from streams.assembler.reward_math import Calibrations, total_reward
from streams.rules.profiles import CODING
from tests.support.streams_events import REG, T0, judge_steps, trajectory


def feed(a: Assembly, events, now=0.0, grace=30.0, tid="t", cal=None):
    out = []
    for e in events:
        a.add(e, now)
        emitted = a.decide(tid, REG, cal or Calibrations(), now, grace)
        out += [emitted] if emitted else []
    return out


def test_complete_trajectory_is_emitted_once_with_the_expected_totals():
    started, steps, ended, rewards = trajectory()
    a = Assembly()
    out = feed(a, [started, *steps, *rewards, ended])
    assert len(out) == 1
    t = out[0]
    assert t.complete and t.missing == [] and t.revision == 0
    assert [s.rule_score for s in t.steps] == [r.score for r in rewards] == [1.0, 0.5, 1.0]
    assert t.process_score == round((1 + 0.5 + 1) / 3, 6)
    assert t.outcome_score == 0.75 and t.efficiency_score is None
    assert t.total_reward == total_reward(0.75, t.process_score, None, CODING)
    assert t.total_reward == round((0.4 * 0.75 + 0.5 * t.process_score) / 0.9, 6)
    assert t.steps[2].tool == "bash" and t.task_id == "task" and t.success is True


def test_any_arrival_order_and_duplicates_give_the_same_single_emission():
    started, steps, ended, rewards = trajectory(reference_steps=2)
    events = [started, *steps, *rewards, ended]
    baseline = feed(Assembly(), events)
    assert baseline[0].efficiency_score == round(2 / 3, 6)
    rng = random.Random(3)
    for _ in range(10):
        shuffled = events + rng.sample(events, 4)  # duplicates
        rng.shuffle(shuffled)
        a, out = Assembly(), []
        for e in shuffled:  # restore from the stored form between events
            out += feed(a, [e])
            a = Assembly.from_dict(json.loads(json.dumps(a.to_dict())))
        assert [o.model_dump() for o in out] == [b.model_dump() for b in baseline]


def test_grace_period_emits_incomplete_with_what_is_missing_then_a_revision():
    started, steps, ended, rewards = trajectory()
    a = Assembly()
    assert feed(a, [started, steps[0], steps[2], rewards[0]], now=100.0) == []
    assert a.decide("t", REG, Calibrations(), now=110.0, grace_s=30.0) is None
    assert a.decide("t", REG, Calibrations(), now=200.0, grace_s=30.0, clock_floor=190.0) is None
    late = a.decide("t", REG, Calibrations(), now=131.0, grace_s=30.0)
    assert late is not None and not late.complete and late.revision == 0
    assert late.missing == ["episode.ended", "step.recorded[1]", "reward.rule.step[1]", "reward.rule.step[2]"]
    assert a.decide("t", REG, Calibrations(), now=500.0, grace_s=30.0) is None  # nothing new: no re-emission
    out = feed(a, [steps[1], *rewards[1:], ended], now=600.0)
    assert len(out) == 1 and out[0].complete and out[0].revision == 1
    assert out[0].event_id != late.event_id


def test_late_human_feedback_makes_a_new_revision_and_replays_recreate_the_ids():
    started, steps, ended, rewards = trajectory()
    label = FeedbackAnnotation(
        event_id="h1",
        trajectory_id="t",
        occurred_at=T0 + timedelta(hours=1),
        producer="ui",
        step_index=1,
        score=0.0,
    )
    events = [started, *steps, *rewards, ended, label]
    first, second = feed(Assembly(), events), feed(Assembly(), events)
    assert [o.revision for o in first] == [0, 1]
    assert [o.event_id for o in first] == [o.event_id for o in second]
    step1 = first[1].steps[1]
    assert step1.human_score == 0.0
    assert step1.process_score == round((0.30 * 0.5 + 1.0 * 0.0) / 1.30, 6)  # rule layer .30, human 1.0


@dataclass
class Shift:
    version: str = "cal-7"

    def apply(self, score: float) -> float:
        return score - 0.2


def test_expected_judge_scores_hold_the_emission_and_are_calibrated():
    """A failed judge call is no judge layer: the step is scored from rules alone, says why the judge
    is missing, and the trajectory's definition differs from a fully judged one."""
    started, steps, ended, rewards = trajectory()
    a = Assembly()
    a.add(started, 0.0, judge_mode="step")
    cal = Calibrations()
    cal.update("coding", "overall", Shift())
    assert feed(a, [*steps, *rewards, ended], cal=cal) == []
    assert a.missing() == [f"reward.judge.step[{i}]" for i in range(3)]
    judged = judge_steps(2, score=0.9)
    failed = JudgeFailed(
        event_id="jf", trajectory_id="t", occurred_at=T0, producer="judge", reason="timeout", step_index=2
    )
    out = feed(a, [*judged, failed], cal=cal)
    assert len(out) == 1 and out[0].complete  # a failure is settled: nothing left to wait for
    t = out[0]
    assert [s.judge_score for s in t.steps] == [0.7, 0.7, None]
    assert t.calibration_version == "cal-7"
    assert t.steps[0].process_score == round((0.30 * 1.0 + 0.70 * 0.7) / 1.0, 6)
    assert t.steps[2].process_score == 1.0  # rule layer only: no judge score is made up
    assert [s.layers for s in t.steps] == [["rules", "judge"], ["rules", "judge"], ["rules"]]
    assert [s.missing_layers for s in t.steps] == [{}, {}, {"judge": "failed (error): timeout"}]
    assert t.missing == ["reward.judge.step[2]"]
    assert t.reward_definition == "rules+judge(partial)@assembly-1+rules-1"
    fully = feed(judged_assembly(cal), [*judge_steps(3, score=0.9)], cal=cal)[0]
    assert fully.reward_definition == "rules+judge@assembly-1+rules-1" != t.reward_definition
    assert fully.missing == [] and {len(s.missing_layers) for s in fully.steps} == {0}


def judged_assembly(cal=None) -> Assembly:
    """A step-mode trajectory with everything but its judge results."""
    started, steps, ended, rewards = trajectory()
    a = Assembly()
    a.add(started, 0.0, judge_mode="step")
    assert feed(a, [*steps, *rewards, ended], cal=cal) == []
    return a


def judge_failed(step, kind="error", at=T0, retry_at=None, eid=None, reason="boom") -> JudgeFailed:
    return JudgeFailed(
        event_id=eid or f"jf-{step}-{kind}-{at.isoformat()}",
        trajectory_id="t",
        occurred_at=at,
        producer="judge",
        reason=reason,
        kind=kind,
        step_index=step,
        retry_at=retry_at,
    )


def test_a_budget_paused_judge_is_waited_for_then_given_up_and_a_later_score_replaces_it():
    a = judged_assembly()
    paused = [judge_failed(i, "budget_paused", retry_at=T0 + timedelta(hours=1)) for i in range(3)]
    assert feed(a, paused, now=100.0) == []  # pending: the assembler waits
    assert a.missing() == [f"reward.judge.step[{i}]" for i in range(3)]
    given_up = a.decide("t", REG, Calibrations(), now=131.0, grace_s=30.0)
    assert given_up is not None and given_up.complete and given_up.revision == 0
    assert given_up.missing == [f"reward.judge.step[{i}]" for i in range(3)]
    reason = given_up.steps[0].missing_layers["judge"]
    assert reason.startswith("pending (budget_paused until 2026-01-01T01:00:00+00:00)")
    assert reason.endswith("given up after the 30s wait")
    assert given_up.reward_definition == "rules@assembly-1+rules-1"
    assert [s.process_score for s in given_up.steps] == [s.rule_score for s in given_up.steps]
    # the judge retries after its budget window: the scores replace the pause, at once
    late = feed(a, judge_steps(3, score=0.9), now=5000.0)
    assert len(late) == 1 and late[0].revision == 1 and late[0].missing == []
    assert late[0].reward_definition == "rules+judge@assembly-1+rules-1"
    assert {tuple(s.layers) for s in late[0].steps} == {("rules", "judge")}


def test_the_newest_judge_failure_stands_in_any_order_and_a_score_is_final():
    early = judge_failed(0, "budget_paused", at=T0, retry_at=T0 + timedelta(hours=1))
    later = judge_failed(0, "error", at=T0 + timedelta(minutes=5), reason="HTTP 500")
    rest = [*judge_steps(3, score=0.5)[1:]]
    outs = []
    for order in ([early, later, *rest], [later, early, *rest], [*rest, later, early]):
        out = feed(judged_assembly(), order)
        outs.append(out[-1].model_dump())
        assert out[-1].steps[0].missing_layers == {"judge": "failed (error): HTTP 500"}
    assert outs[0] == outs[1] == outs[2]
    a = judged_assembly()
    feed(a, judge_steps(1, score=0.5))
    assert a.add(later, 0.0) is False  # a failure after a score does not undo it
    assert a.judge_steps[0] == {"score": 0.5, "scores": {}}


def test_a_failed_trajectory_judge_is_missing_on_every_step():
    started, steps, ended, rewards = trajectory()
    a = Assembly()
    a.add(started, 0.0, judge_mode="trajectory")
    failed = JudgeFailed(
        event_id="jt", trajectory_id="t", occurred_at=T0, producer="judge", reason="bad json", kind="parse"
    )
    [t] = feed(a, [*steps, *rewards, ended, failed])
    assert t.complete and t.missing == ["reward.judge.trajectory"]
    assert {s.missing_layers["judge"] for s in t.steps} == {"failed (parse): bad json"}
    assert t.reward_definition == "rules@assembly-1+rules-1"


def test_without_the_judge_expected_no_judge_layer_is_missing_and_rules_absent_is_named():
    started, steps, ended, rewards = trajectory()
    [t] = feed(Assembly(), [started, *steps, *rewards, ended])
    assert [s.layers for s in t.steps] == [["rules"]] * 3 and {len(s.missing_layers) for s in t.steps} == {0}
    assert t.reward_definition == "rules@assembly-1+rules-1"
    a = Assembly()
    feed(a, [started, *steps, rewards[0], ended], now=0.0)
    late = a.decide("t", REG, Calibrations(), now=31.0, grace_s=30.0)
    assert late is not None and not late.complete  # rules are never given up
    assert late.steps[1].missing_layers == {"rules": "no reward.rule.step; given up after the 30s wait"}
    assert late.reward_definition == "rules(partial)@assembly-1+rules-1"


def test_a_failure_stored_before_the_layer_fields_reads_as_failed_for_good():
    a = judged_assembly()
    stored = a.to_dict() | {"judge_steps": {str(i): {"failed": "old"} for i in range(3)}}
    restored = Assembly.from_dict(stored)
    assert restored.missing() == []
    t = restored.decide("t", REG, Calibrations(), now=0.0, grace_s=30.0)
    assert t.complete and t.steps[0].missing_layers == {"judge": "failed (error): old"}


def test_without_any_signal_scores_are_absent():
    started, steps, ended, rewards = trajectory(domain="advisory")
    out = feed(Assembly(), [started, *steps, *rewards, ended])
    t = out[0]
    assert t.process_score is None and {s.process_score for s in t.steps} == {None}
    assert {s.missing_layers["rules"] for s in t.steps} == {
        "no signal: no rule component applies to this step"
    }
    assert t.reward_definition == "none@assembly-1+rules-1" and t.complete
    assert t.total_reward == t.outcome_score == 1.0  # advisory outcome: success; process absent

"""The processors' batch logic without faust: dead letters with coordinates, conflicting steps,
grace expiry and restored trajectories, the worker's option checks."""

from __future__ import annotations

from datetime import timedelta

import pytest

from schemas import topics
from schemas.codec import encode
from schemas.events import JudgeFailed
from schemas.records import Record
from streams.assembler.processor import TrajectoryAssembler
from streams.config import WorkerConfig
from streams.errors import WorkerConfigError
from streams.rules.processor import RuleRewarder
from streams.rules.profiles import ProfileRegistry
from tests.support.streams_events import T0, judge_steps, trajectory


def records(events, topic=topics.AGENT_EVENTS, start=0):
    return [Record(topic, 0, start + i, e.trajectory_id.encode(), encode(e)) for i, e in enumerate(events)]


def test_bad_records_become_dead_letters_with_their_coordinates():
    rewarder = RuleRewarder(ProfileRegistry())
    started, steps, _ended, rewards = trajectory()
    bad = [
        Record(topics.AGENT_EVENTS, 2, 40, b"k1", b"{nope"),
        Record(topics.AGENT_EVENTS, 2, 41, b"k2", encode(rewards[0])),  # valid, but not for this topic
        Record(topics.AGENT_EVENTS, 2, 42, None, None),
    ]
    result = rewarder.process(records([started, *steps]) + bad, {}.get)
    assert len(result.outputs) == len(steps)
    assert [(d.source_partition, d.source_offset, d.stage) for d in result.dead] == [
        (2, 40, "rules"),
        (2, 41, "rules"),
        (2, 42, "rules"),
    ]
    assert "not valid JSON" in result.dead[0].reason
    assert "reward.rule.step" in result.dead[1].reason and result.dead[1].source_key == "k2"


def test_a_different_event_for_a_scored_step_is_a_dead_letter_and_repeats_are_reemitted():
    rewarder = RuleRewarder(ProfileRegistry())
    started, steps, _, _ = trajectory()
    store = {}
    first = rewarder.process(records([started, *steps]), store.get)
    store.update(first.updates)
    rewarder.cache.clear()  # as after a restart: state comes from the table
    impostor = steps[0].model_copy(update={"event_id": "other"})
    again = rewarder.process(records([steps[0], impostor], start=10), store.get)
    assert [o.model_dump() for o in again.outputs] == [first.outputs[0].model_dump()]
    assert len(again.dead) == 1 and "already scored" in again.dead[0].reason


def test_assembler_expires_after_grace_and_tracks_restored_trajectories():
    clock = [1000.0]
    assembler = TrajectoryAssembler(ProfileRegistry(), grace_s=30, clock=lambda: clock[0])
    started, steps, _, rewards = trajectory()
    store = {}
    result = assembler.process(records([started, *steps]) + records(rewards, topics.REWARD_RULE), store.get)
    store.update(result.updates)
    assert result.outputs == [] and list(assembler.open) == [b"t"]
    clock[0] += 31
    expired = assembler.expire(store.get)
    assert [(t.complete, t.missing) for t in expired.outputs] == [(False, ["episode.ended"])]
    # a restarted assembler finds the trajectory in its table; nothing new: no second emission
    store.update(expired.updates)
    fresh = TrajectoryAssembler(ProfileRegistry(), grace_s=30, clock=lambda: clock[0])
    assert fresh.track_restored(store.items()) == 1
    clock[0] += 31
    assert fresh.expire(store.get).outputs == []


def test_assembler_waits_for_a_budget_paused_judge_then_gives_it_up_on_the_timer():
    clock = [1000.0]
    assembler = TrajectoryAssembler(
        ProfileRegistry(), grace_s=30, judge_mode=lambda _started: "step", clock=lambda: clock[0]
    )
    started, steps, ended, rewards = trajectory()
    paused = [
        JudgeFailed(
            event_id=f"p{i}", trajectory_id="t", occurred_at=T0, producer="judge", reason="budget",
            kind="budget_paused", step_index=i, retry_at=T0 + timedelta(hours=1),
        )
        for i in range(len(steps))
    ]  # fmt: skip
    store = {}
    batch = records([started, *steps, ended]) + records(rewards, topics.REWARD_RULE)
    result = assembler.process(batch + records(paused, topics.REWARD_JUDGE), store.get)
    store.update(result.updates)
    assert result.outputs == [] and list(assembler.open) == [b"t"]
    clock[0] += 31
    [t] = assembler.expire(store.get).outputs
    assert t.complete and {s.layers[0] for s in t.steps} == {"rules"}
    assert all("given up after the 30s wait" in s.missing_layers["judge"] for s in t.steps)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"roles": ("scoring", "nope")}, "--roles"),
        ({"grace_seconds": 0}, "--grace-seconds"),
        ({"batch_max": 0}, "--batch"),
    ],
)
def test_worker_config_names_the_bad_option(kwargs, needle):
    with pytest.raises(WorkerConfigError, match=needle):
        WorkerConfig(bootstrap_servers="x:1", **kwargs)


def test_calibration_events_are_applied_and_survive_a_restart():
    from schemas.events import CalibrationUpdated

    cal = CalibrationUpdated(
        event_id="c1",
        trajectory_id="calibration:coding:overall",
        occurred_at=T0,
        producer="calibrate",
        version="iso-1",
        domain="coding",
        rubric="overall",
        xs=[0.0, 1.0],
        ys=[0.0, 0.5],
    )
    store = {}
    first = TrajectoryAssembler(ProfileRegistry(), grace_s=30, judge_mode=lambda s: "step")
    store.update(first.process(records([cal], topics.FEEDBACK_HUMAN), store.get).updates)
    restarted = TrajectoryAssembler(ProfileRegistry(), grace_s=30, judge_mode=lambda s: "step")
    restarted.track_restored(list(store.items()))
    started, steps, ended, rewards = trajectory()
    judged = judge_steps(len(steps), score=0.8)
    result = restarted.process(
        records([started, *steps, ended])
        + records(rewards, topics.REWARD_RULE)
        + records(judged, topics.REWARD_JUDGE),
        store.get,
    )
    (scored,) = result.outputs
    assert scored.complete and scored.calibration_version == "iso-1"
    assert {s.judge_score for s in scored.steps} == {0.4}

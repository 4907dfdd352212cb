"""The scoring role's batch logic (rules and assembly fused): the same rule rewards and scored
trajectories as the rules and the assembly run one after the other, each record decoded once,
idempotent replays."""

from __future__ import annotations

import pytest

from schemas import topics
from schemas.codec import encode
from schemas.records import Record
from streams.assembler.processor import TrajectoryAssembler
from streams.rules.processor import RuleRewarder
from streams.rules.profiles import ProfileRegistry
from streams.scoring.processor import RULES_TABLE, Scoring
from tests.support.streams_events import judge_steps, trajectory

VERSION = "rules-1"


def records(events, topic=topics.AGENT_EVENTS, start=0, partition=0):
    return [
        Record(topic, partition, start + i, e.trajectory_id.encode(), encode(e)) for i, e in enumerate(events)
    ]


def scoring(clock=lambda: 1000.0) -> Scoring:
    assembler = TrajectoryAssembler(ProfileRegistry(), grace_s=30, clock=clock, rule_version=VERSION)
    return Scoring(RuleRewarder(ProfileRegistry(), VERSION), assembler)


def split(batch):
    """The rules, then the assembly over the batch and the rules' output records (pure, no roles)."""
    rules = RuleRewarder(ProfileRegistry(), VERSION).process(batch, {}.get)
    assembler = TrajectoryAssembler(ProfileRegistry(), grace_s=30, clock=lambda: 1000.0, rule_version=VERSION)
    assembled = assembler.process(batch + records(rules.outputs, topics.REWARD_RULE), {}.get)
    return rules, assembled


def dumps(events):
    return [e.model_dump() for e in events]


def test_one_pass_gives_the_rule_rewards_and_the_trajectories_of_the_two_roles():
    events = []
    for tid in ("a", "b"):
        started, steps, ended, _ = trajectory(tid)
        events += [started, *steps, ended]
    batch = records(events)
    result = scoring().process(batch, {}.get, {}.get)
    rules, assembled = split(batch)
    rewards = [e for e in result.outputs if e.type == "reward.rule.step"]
    scored = [e for e in result.outputs if e.type == "trajectory.scored"]
    assert dumps(rewards) == dumps(rules.outputs) and len(rewards) == 6
    assert dumps(scored) == dumps(assembled.outputs) and [s.complete for s in scored] == [True, True]
    assert result.tables[RULES_TABLE] == rules.updates  # the rules' states, in their own table
    assert result.updates == assembled.updates
    assert not result.dead


def test_rewards_join_trajectories_across_batches_and_with_the_judge():
    started, steps, ended, _ = trajectory()
    processor = scoring()
    rules_table, state_table = {}, {}
    first = processor.process(records([started, steps[0]]), rules_table.get, state_table.get)
    rules_table.update(first.tables[RULES_TABLE])
    state_table.update(first.updates)
    assert [e.type for e in first.outputs] == ["reward.rule.step"]
    later = records([*steps[1:], ended], start=2) + records(judge_steps(3, 0.5), topics.REWARD_JUDGE)
    second = processor.process(later, rules_table.get, state_table.get)
    (scored,) = [e for e in second.outputs if e.type == "trajectory.scored"]
    assert scored.complete and [s.rule_score is not None for s in scored.steps] == [True] * 3


def test_a_replayed_batch_re_emits_the_same_rewards_and_no_new_trajectory():
    started, steps, ended, _ = trajectory()
    batch = records([started, *steps, ended])
    processor = scoring()
    rules_table, state_table = {}, {}
    first = processor.process(batch, rules_table.get, state_table.get)
    rules_table.update(first.tables[RULES_TABLE])
    state_table.update(first.updates)
    processor = scoring()  # as after a restart: the state comes from the tables
    again = processor.process(batch, rules_table.get, state_table.get)
    first_rewards = [e for e in first.outputs if e.type == "reward.rule.step"]
    assert dumps(again.outputs) == dumps(first_rewards)  # re-emitted: same ids, same bytes
    assert not again.updates and not again.tables.get(RULES_TABLE) and not again.dead


def test_bad_records_are_dead_letters_once_under_the_scoring_stage():
    started, steps, _, rewards = trajectory()
    bad = [
        Record(topics.AGENT_EVENTS, 1, 40, b"k1", b"{nope"),
        Record(topics.AGENT_EVENTS, 1, 41, b"k2", encode(rewards[0])),  # valid, but not for this topic
    ]
    result = scoring().process(records([started, *steps]) + bad, {}.get, {}.get)
    assert [(d.stage, d.source_partition, d.source_offset) for d in result.dead] == [
        ("scoring", 1, 40),
        ("scoring", 1, 41),
    ]
    assert len([e for e in result.outputs if e.type == "reward.rule.step"]) == 3


def test_a_conflicting_step_is_a_dead_letter_of_the_scoring_stage():
    started, steps, _, _ = trajectory()
    processor = scoring()
    rules_table, state_table = {}, {}
    first = processor.process(records([started, *steps]), rules_table.get, state_table.get)
    rules_table.update(first.tables[RULES_TABLE])
    impostor = steps[0].model_copy(update={"event_id": "other"})
    again = processor.process(records([impostor], start=9), rules_table.get, state_table.get)
    assert [(d.stage, d.error_type) for d in again.dead] == [("scoring", "ConflictingStep")]


def test_the_assembler_must_take_the_version_the_rules_stamp():
    assembler = TrajectoryAssembler(ProfileRegistry(), grace_s=30, rule_version="rules-2")
    with pytest.raises(ValueError, match="rule_version"):
        Scoring(RuleRewarder(ProfileRegistry(), "rules-1"), assembler)


def test_the_scoring_role_does_not_read_rule_rewards_back():
    assert topics.REWARD_RULE not in Scoring.sources
    assert set(Scoring.sources) == set(TrajectoryAssembler.sources) - {topics.REWARD_RULE}

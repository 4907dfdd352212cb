"""One assembler per rule version (issue #17): the assembler takes only `reward.rule.step` events of
its configured version (`--reward-version`), so a replay under a new version never changes the live
trajectories, and the replay's trajectories carry the new version in `reward_version` and their ids."""

from __future__ import annotations

from schemas import topics
from schemas.codec import encode
from schemas.records import Record
from streams.assembler.processor import TrajectoryAssembler
from streams.rules.profiles import ProfileRegistry
from tests.support.streams_events import trajectory


def records(events, topic=topics.AGENT_EVENTS, start=0):
    return [Record(topic, 0, start + i, e.trajectory_id.encode(), encode(e)) for i, e in enumerate(events)]


def relabelled(rewards, version: str, score: float):
    """The same steps' rule rewards under another version (other ids, other scores)."""
    return [
        r.model_copy(
            update={"event_id": f"{r.event_id}-{version}", "reward_version": version, "score": score}
        )
        for r in rewards
    ]


def assembler(version: str | None) -> TrajectoryAssembler:
    return TrajectoryAssembler(ProfileRegistry(), grace_s=30, clock=lambda: 1000.0, rule_version=version)


def test_only_the_configured_versions_rule_rewards_are_assembled():
    started, steps, ended, live = trajectory()
    replayed = relabelled(live, "rules-2", 0.0)
    store: dict = {}
    first = assembler("rules-1").process(
        records([started, *steps, ended]) + records(replayed, topics.REWARD_RULE), store.get
    )
    store.update(first.updates)
    assert first.outputs == []  # rules-2 rewards do not fill the rules-1 slots: still waiting
    then = assembler("rules-1").process(records(live, topics.REWARD_RULE, start=10), store.get)
    [scored] = then.outputs
    assert scored.complete and scored.reward_version == "assembly-1+rules-1"
    assert [s.rule_score for s in scored.steps] == [r.score for r in live]
    assert scored.reward_definition.endswith("@assembly-1+rules-1")


def test_rule_rewards_of_another_version_change_nothing_after_an_emission():
    started, steps, ended, live = trajectory()
    store: dict = {}
    live_assembler = assembler("rules-1")
    done = live_assembler.process(
        records([started, *steps, ended]) + records(live, topics.REWARD_RULE), store.get
    )
    store.update(done.updates)
    assert len(done.outputs) == 1
    later = live_assembler.process(
        records(relabelled(live, "rules-2", 0.0), topics.REWARD_RULE, 20), store.get
    )
    assert later.outputs == [] and later.updates == {} and later.dead == []  # ignored, not a conflict


def test_the_same_input_under_another_version_gets_that_version_and_other_ids():
    started, steps, ended, live = trajectory()
    new = relabelled(live, "rules-2", 0.25)
    both = records([started, *steps, ended]) + records([*live, *new], topics.REWARD_RULE)
    [v1] = assembler("rules-1").process(both, {}.get).outputs
    [v2] = assembler("rules-2").process(both, {}.get).outputs
    assert (v1.reward_version, v2.reward_version) == ("assembly-1+rules-1", "assembly-1+rules-2")
    assert [s.rule_score for s in v2.steps] == [0.25] * len(steps)
    assert v1.event_id != v2.event_id and v1.trajectory_id == v2.trajectory_id


def test_an_emission_without_rule_rewards_still_names_the_configured_version():
    started, steps, ended, _ = trajectory()
    clock = [1000.0]
    a = TrajectoryAssembler(ProfileRegistry(), grace_s=30, clock=lambda: clock[0], rule_version="rules-2")
    store: dict = {}
    store.update(a.process(records([started, *steps, ended]), store.get).updates)
    clock[0] += 31
    [scored] = a.expire(store.get).outputs  # the grace period ran out with no rule reward at all
    assert not scored.complete and scored.reward_version == "assembly-1+rules-2"


def test_without_a_configured_version_the_first_rule_reward_of_a_step_is_taken():
    started, steps, ended, live = trajectory()
    first = relabelled(live, "r", 0.5)
    [scored] = (
        assembler(None)
        .process(records([started, *steps, ended]) + records([*first, *live], topics.REWARD_RULE), {}.get)
        .outputs
    )
    assert scored.reward_version == "assembly-1+r" and [s.rule_score for s in scored.steps] == [0.5] * 3


def test_the_module_examples_hold():
    import doctest

    from streams.assembler import scored

    assert doctest.testmod(scored).failed == 0

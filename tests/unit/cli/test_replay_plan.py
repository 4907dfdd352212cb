"""The replay plan's pure parts (infra.replay): role checks, group names, what is left to read."""

from __future__ import annotations

import argparse
import doctest
from datetime import UTC, datetime

import pytest

from infra import replay
from infra.commands.replay import _worker_args
from infra.replay import ReplayError, ReplayPlan, app_prefix, check_roles, phases, remaining, upstream_topics
from streams.scoring.processor import Scoring


def test_the_module_examples_hold():
    assert doctest.testmod(replay).failed == 0


def test_each_run_gets_its_own_groups_named_by_version_and_time():
    prefix = app_prefix("rules-2", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    plan = ReplayPlan(("scoring",), "rules-2", prefix)
    assert plan.group("scoring") == "agentstream-replay-rules-2-20260102T030405-scoring"


@pytest.mark.parametrize("version", ["", "rules 2", "a/b", "v;drop"])
def test_a_version_that_cannot_name_a_group_is_refused_with_its_value(version):
    with pytest.raises(ReplayError, match="--reward-version") as caught:
        app_prefix(version)
    assert repr(version) in str(caught.value)


def test_every_role_is_replayable_in_phases_and_unknown_ones_are_refused():
    roles = ("batch", "scoring", "judge")
    assert check_roles(roles) == roles
    assert phases(roles) == [("judge",), ("scoring",), ("batch",)]
    with pytest.raises(ReplayError, match="unknown role 'x'"):
        check_roles(("x",))


@pytest.mark.parametrize("role", ["rules", "assembler"])
def test_the_roles_merged_into_scoring_are_refused_saying_what_to_run(role):
    with pytest.raises(ReplayError) as refused:
        check_roles(("judge", role))
    message = str(refused.value)
    assert f"{role!r} is no longer a role" in message
    assert "--roles scoring" in message and "replayable: judge, scoring, batch" in message


def test_what_is_left_counts_from_the_start_and_ignores_other_topics():
    starts = {("agent.events", 0): 5, ("agent.events", 1): 0}
    ends = {("agent.events", 0): 10, ("agent.events", 1): 4, ("reward.rule", 0): 99}
    plan = ReplayPlan(("judge",), "v", "p", starts, ends)
    assert remaining({}, plan, "judge") == 5 + 4
    assert remaining({("agent.events", 0): 10, ("agent.events", 1): 3}, plan, "judge") == 1
    assert remaining({("agent.events", 0): 12, ("agent.events", 1): 4}, plan, "judge") == 0


def test_scoring_is_measured_on_every_topic_its_agent_reads():
    assert replay.SOURCES["scoring"] == Scoring.sources
    assert "reward.rule" not in replay.SOURCES["scoring"]  # it joins the rule rewards it makes itself
    assert replay.SOURCES["judge"] == ("agent.events",)


def test_the_judge_runs_before_scoring_whatever_the_order_asked():
    assert phases(("scoring", "judge")) == [("judge",), ("scoring",)]
    assert phases(("scoring",)) == [("scoring",)]


def test_scoring_measures_again_only_what_replayed_roles_wrote():
    plan = ReplayPlan(("judge", "scoring", "batch"), "v", "p")
    assert upstream_topics(plan, "scoring", ("judge",)) == ("reward.judge",)
    assert upstream_topics(plan, "scoring", ()) == ()
    assert upstream_topics(plan, "batch", ("judge", "scoring")) == ("trajectory.scored",)
    assert upstream_topics(plan, "judge", ()) == ()


def test_later_ends_extend_a_roles_work_and_never_shrink_it():
    ends = {("agent.events", 0): 10, ("reward.judge", 0): 4}
    plan = ReplayPlan(("judge", "scoring"), "v", "p", {}, ends)
    assert (plan.total_for("judge"), plan.total_for("scoring")) == (10, 14)
    later = plan.with_ends({("reward.judge", 0): 9, ("agent.events", 0): 3})
    assert later.ends == {("agent.events", 0): 10, ("reward.judge", 0): 9}
    assert remaining({("agent.events", 0): 10, ("reward.judge", 0): 4}, later, "scoring") == 5
    assert remaining({("agent.events", 0): 10}, later, "judge") == 0  # reward.judge is not the judge's input


def test_the_judges_internal_topic_counts_once_measured():
    plan = ReplayPlan(("judge",), "v", "p", {}, {("agent.events", 0): 3})
    assert plan.topics("judge") == ("agent.events", "p-judge-judge-groups")
    measured = plan.with_ends({("p-judge-judge-groups", 1): 2})
    assert remaining({("agent.events", 0): 3}, measured, "judge") == 2


def _args(**given):
    defaults = {"profiles": None, "judge_rules": None, "expect_judge": False, "grace_seconds": 30.0}
    return argparse.Namespace(**{**defaults, **given})


def test_each_replayed_worker_gets_the_options_of_its_role():
    plan = ReplayPlan(("judge", "scoring"), "rules-2", "pre")
    args = _args(profiles="p.yaml", judge_rules="j.yaml", grace_seconds=3.0)
    judge, scoring = (_worker_args(args, plan, role) for role in plan.roles)
    common = ("--app-prefix", "pre", "--reward-version", "rules-2")
    assert judge == ("worker", "--roles", "judge", *common, "--judge-rules", "j.yaml")
    assert scoring == (
        *("worker", "--roles", "scoring", *common),
        *("--profiles", "p.yaml", "--judge-rules", "j.yaml", "--grace-seconds", "3.0", "--expect-judge"),
    )  # beside a replayed judge scoring waits for it, as the live one does beside the live judge


def test_scoring_alone_waits_for_the_judge_only_when_told():
    alone = ReplayPlan(("scoring",), "v", "p")
    assert "--expect-judge" not in _worker_args(_args(), alone, "scoring")
    assert "--expect-judge" in _worker_args(_args(expect_judge=True), alone, "scoring")

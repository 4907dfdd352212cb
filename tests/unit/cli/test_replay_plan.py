"""The replay plan's pure parts (infra.replay): role checks, group names, what is left to read."""

from __future__ import annotations

import doctest
from datetime import UTC, datetime

import pytest

from infra import replay
from infra.replay import ReplayError, ReplayPlan, app_prefix, check_roles, remaining


def test_the_module_examples_hold():
    assert doctest.testmod(replay).failed == 0


def test_each_run_gets_its_own_groups_named_by_version_and_time():
    plan = ReplayPlan(("rules",), "rules-2", app_prefix("rules-2", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)))
    assert plan.group("rules") == "agentstream-replay-rules-2-20260102T030405-rules"


@pytest.mark.parametrize("version", ["", "rules 2", "a/b", "v;drop"])
def test_a_version_that_cannot_name_a_group_is_refused_with_its_value(version):
    with pytest.raises(ReplayError, match="--reward-version") as caught:
        app_prefix(version)
    assert repr(version) in str(caught.value)


def test_roles_not_replayable_yet_say_why():
    with pytest.raises(ReplayError, match="'judge' is not supported yet: the judge's cache"):
        check_roles(("rules", "judge"))
    with pytest.raises(ReplayError, match="unknown role 'x'"):
        check_roles(("x",))


def test_what_is_left_counts_from_the_start_and_ignores_other_topics():
    starts = {("agent.events", 0): 5, ("agent.events", 1): 0}
    ends = {("agent.events", 0): 10, ("agent.events", 1): 4, ("reward.rule", 0): 99}
    plan = ReplayPlan(("rules",), "v", "p", starts, ends)
    assert remaining({}, plan, "rules") == 5 + 4
    assert remaining({("agent.events", 0): 10, ("agent.events", 1): 3}, plan, "rules") == 1
    assert remaining({("agent.events", 0): 12, ("agent.events", 1): 4}, plan, "rules") == 0

"""One rubric catalogue (streams.rubrics): the rule profiles and the judge's rubric sets weigh every
built-in domain the same way, and an unknown domain (crew included) falls back to generic in both."""

from __future__ import annotations

import pytest

from streams.judge.rubrics import BUILTIN, RubricCatalog, rubrics_for
from streams.rubrics import BUILTIN_RUBRICS, RULE_RUBRIC_IDS
from streams.rules.profiles import BUILTIN_PROFILES, ProfileRegistry


def _judge_view(domain: str) -> dict[str, tuple[float, str]]:
    return {r.id: (r.weight, r.evaluator) for r in rubrics_for(domain).rubrics}


def _rules_view(domain: str) -> dict[str, tuple[float, str]]:
    return {rid: (spec.weight, spec.evaluator) for rid, spec in ProfileRegistry().get(domain).rubrics.items()}


def test_rules_and_judge_have_the_same_built_in_domains():
    assert set(BUILTIN_PROFILES) == set(BUILTIN) == set(BUILTIN_RUBRICS)


@pytest.mark.parametrize("domain", sorted(BUILTIN_RUBRICS))
def test_rules_profile_and_judge_rubric_set_agree(domain):
    """Same rubric ids, same weights, same evaluators, in the same order."""
    assert list(_rules_view(domain).items()) == list(_judge_view(domain).items())
    assert rubrics_for(domain).domain == ProfileRegistry().get(domain).domain == domain


@pytest.mark.parametrize("domain", sorted(BUILTIN_RUBRICS))
def test_each_built_in_set_weighs_to_one_and_rule_rubrics_are_the_rules(domain):
    rubrics = BUILTIN_RUBRICS[domain]
    assert sum(r.weight for r in rubrics) == pytest.approx(1.0)
    assert {r.id for r in rubrics if r.evaluator == "rule"} <= RULE_RUBRIC_IDS
    assert all(r.description for r in rubrics)


@pytest.mark.parametrize("domain", ["crew", "no-such-domain"])
def test_crew_and_unknown_domains_use_generic_in_both_layers(domain):
    assert rubrics_for(domain).domain == "generic"
    assert ProfileRegistry().get(domain).domain == "generic"
    assert _judge_view(domain) == _rules_view(domain) == _judge_view("generic")


def test_the_seed_default_set_is_the_generic_one():
    """reference/seed-knowlyr-gym.md 2.4: goal_progress .30 M, tool_choice .20 M, param_correctness .20 M,
    info_utilization .15 R, non_redundancy .15 R."""
    assert _judge_view("generic") == {
        "goal_progress": (0.30, "model"),
        "tool_choice": (0.20, "model"),
        "param_correctness": (0.20, "model"),
        "info_utilization": (0.15, "rule"),
        "non_redundancy": (0.15, "rule"),
    }


def test_a_judge_override_does_not_change_the_catalogue():
    catalog = RubricCatalog({"coding": [rubrics_for("coding").rubrics[0]]})
    assert [r.id for r in catalog.for_domain("coding").rubrics] == ["goal_progress"]
    assert len(rubrics_for("coding").rubrics) == len(BUILTIN_RUBRICS["coding"]) == 5

"""The judge without a rules file judges every trajectory as a whole; a rules file configured but
missing is an error naming it (for the judge role and for the assembler's reading alike)."""

from __future__ import annotations

import asyncio
import doctest
import logging
import re

import pytest

import streams.judge.selection as selection_module
from streams.errors import JudgeRulesError
from streams.judge.config import JudgeConfig
from streams.judge.role import build_processor, register
from streams.judge.selection import DEFAULT_RULE, DEFAULT_RULES, JudgeRules
from tests.support.judge_events import started, trajectory
from tests.support.judge_servers.chat import ChatServer


def test_no_rules_file_gives_the_default_rule_every_trajectory_as_a_whole():
    rules = JudgeRules.for_judge(None)
    assert rules is DEFAULT_RULES and rules.rules == [DEFAULT_RULE]
    for kw in ({"domain": "coding"}, {"domain": "crew", "agent": "x"}, {"domain": "no-such-domain"}):
        for n in range(20):
            assert rules.mode_for(started(f"t{n}", **kw)) == "trajectory"
    assert JudgeRules.for_judge("").rules == [DEFAULT_RULE]  # an empty variable is not given


def test_a_rules_file_replaces_the_default_and_an_empty_one_judges_nothing(tmp_path):
    coding = tmp_path / "rules.yaml"
    coding.write_text("rules:\n  - name: coding\n    domains: [coding]\n    mode: step\n")
    rules = JudgeRules.for_judge(coding)
    assert rules.mode_for(started("t", domain="coding")) == "step"
    assert rules.mode_for(started("t", domain="ops")) is None
    empty = tmp_path / "none.yaml"
    empty.write_text("rules: []\n")
    assert JudgeRules.for_judge(empty).rules == []


def test_a_configured_rules_file_that_does_not_exist_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "typo-rules.yaml"
    with pytest.raises(JudgeRulesError, match=re.escape(f"judge rules file {missing} does not exist")):
        JudgeRules.for_judge(missing)
    config = JudgeConfig(api_key="k", rules_path=missing)
    with pytest.raises(JudgeRulesError, match=re.escape(f"{missing} does not exist")):
        build_processor(config)


def test_load_alone_still_gives_no_rules_without_a_file():
    """The assembler reads rules with `load`: no file, no judge scores expected (unchanged)."""
    assert JudgeRules.load(None).rules == []


def test_the_role_builds_its_processor_on_the_default_rule(caplog):
    with caplog.at_level(logging.INFO, logger="streams.judge.role"):
        processor = build_processor(JudgeConfig(api_key="k", rules_path=None))
    assert processor.rules is DEFAULT_RULES
    assert "default rule 'all-trajectories'" in caplog.text


def test_without_a_key_the_role_registers_nothing_and_names_the_variable(caplog, monkeypatch):
    for name in ("AGENTSTREAM_JUDGE_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with caplog.at_level(logging.WARNING, logger="streams.judge.role"):
        assert register(app=None, config=JudgeConfig(provider="openai", model="m")) is None
    assert "OPENAI_API_KEY" in caplog.text and "judge is off" in caplog.text


def test_default_rule_judges_trajectories_of_every_domain_once_over_chat_completions():
    """The role's processor with no rules file and provider openai: one trajectory call each."""
    with ChatServer() as server:
        config = JudgeConfig(
            provider="openai", model="judge-model", api_key="k", base_url=server.base_url, max_attempts=1
        )
        processor = build_processor(config)
        events = [e for d in ("coding", "ops", "crew") for e in trajectory(f"t-{d}", n=2, domain=d, task=d)]

        async def go():
            try:
                return await processor.process_events(events)
            finally:
                await processor.client.close()

        outputs = asyncio.run(go()).outputs
    assert sorted(e.trajectory_id for e in outputs) == ["t-coding", "t-crew", "t-ops"]
    assert all(e.type == "reward.judge.trajectory" and e.mode == "trajectory" for e in outputs)
    assert all(e.judge_model == "judge-model" and e.scores for e in outputs)
    assert len(server.requests) == 3


def test_doctests():
    assert doctest.testmod(selection_module).failed == 0

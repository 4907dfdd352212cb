"""One rule for the three option files (profiles, judge rules, judge rubrics): not given means the
built-in defaults; given but missing is an error that names the path, never a silent fall-back."""

from __future__ import annotations

import pytest

from streams.errors import JudgeRulesError, ProfileError, RubricsError, StreamsError
from streams.judge.config import JudgeConfig
from streams.judge.rubrics import RubricCatalog, rubrics_for
from streams.judge.selection import JudgeRules
from streams.rules.profiles import BUILTIN_PROFILES, ProfileRegistry

LOADERS = [
    pytest.param(ProfileRegistry.from_file, ProfileError, "profiles file", id="profiles"),
    pytest.param(JudgeRules.load, JudgeRulesError, "judge rules file", id="judge-rules"),
    pytest.param(RubricCatalog.load, RubricsError, "rubrics file", id="rubrics"),
]


@pytest.mark.parametrize("not_given", [None, ""])
def test_not_given_means_the_defaults(not_given):
    assert ProfileRegistry.from_file(not_given).names() == sorted(BUILTIN_PROFILES)
    assert JudgeRules.load(not_given).rules == []
    assert RubricCatalog.load(not_given).for_domain("coding") == rubrics_for("coding")


@pytest.mark.parametrize(("load", "error", "what"), LOADERS)
def test_given_but_missing_is_an_error_naming_the_path(tmp_path, load, error, what):
    path = tmp_path / "typo" / "options.yaml"
    with pytest.raises(error) as raised:
        load(path)
    assert str(raised.value) == f"{what} {path} does not exist"
    assert isinstance(raised.value, StreamsError)
    with pytest.raises(error, match="does not exist"):
        load(str(path))


@pytest.mark.parametrize(("load", "error", "what"), LOADERS)
def test_a_directory_is_not_a_file(tmp_path, load, error, what):
    with pytest.raises(error, match=f"{what} {tmp_path} is not a file"):
        load(tmp_path)


def test_given_and_present_files_are_read(tmp_path):
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text("domain: ops\nextends: coding\n")
    assert ProfileRegistry.from_file(profiles).get("ops").domain == "ops"
    rules = tmp_path / "rules.json"
    rules.write_text('[{"name": "all", "mode": "trajectory"}]')
    assert [r.name for r in JudgeRules.load(rules).rules] == ["all"]
    rubrics = tmp_path / "rubrics.yaml"
    rubrics.write_text("ops:\n  - {id: safety, weight: 1.0, description: Nothing breaks.}\n")
    assert [r.id for r in RubricCatalog.load(rubrics).for_domain("ops").rubrics] == ["safety"]


def test_the_default_judge_config_names_no_files(monkeypatch):
    """A default configuration must keep starting: no default path points at a file."""
    for name in ("AGENTSTREAM_JUDGE_RULES_PATH", "AGENTSTREAM_JUDGE_RUBRICS_PATH"):
        monkeypatch.delenv(name, raising=False)
    config = JudgeConfig()
    assert (config.rules_path, config.rubrics_path) == (None, None)
    monkeypatch.setenv("AGENTSTREAM_JUDGE_RULES_PATH", "")  # an empty variable is not given
    assert JudgeConfig().rules_path is None
    assert JudgeRules.load(JudgeConfig().rules_path).rules == []

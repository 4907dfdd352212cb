"""Which trajectories scoring waits for judge results on: the rules file's, else the judge's
default rule when the judge runs beside it (`expect_judge`: set by `up --judge` and by
`worker --roles ...,judge`), else none."""

from __future__ import annotations

from schemas.events import EpisodeStarted, utc_now
from streams.config import WorkerConfig
from streams.scoring.role import judge_mode_function


def _started() -> EpisodeStarted:
    return EpisodeStarted(
        event_id="e", trajectory_id="t", occurred_at=utc_now(), producer="p", task_id="k", domain="coding"
    )


def test_without_rules_or_a_judge_beside_it_nothing_is_waited_for():
    assert judge_mode_function(WorkerConfig(roles=("scoring",)))(_started()) is None


def test_with_a_judge_beside_it_the_default_rule_makes_every_trajectory_wait_for_its_score():
    config = WorkerConfig(roles=("scoring",), expect_judge=True)
    assert judge_mode_function(config)(_started()) == "trajectory"


def test_a_rules_file_decides_whether_or_not_a_judge_is_beside_it(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - {name: other, domains: [math], mode: step}\n")
    for expect in (False, True):
        config = WorkerConfig(roles=("scoring",), judge_rules_path=rules, expect_judge=expect)
        assert judge_mode_function(config)(_started()) is None  # coding is not selected

"""The rule layer on JSON trajectories: the same scores as the stream workers' pure functions."""

from __future__ import annotations

import doctest
import json

import pytest

import infra.mcp.json_trajectory
import infra.mcp.readonly
import infra.mcp.values
from infra.mcp.errors import McpToolError
from infra.mcp.json_trajectory import score_json_trajectory, trajectory_events
from schemas.events import EpisodeEnded
from streams.rules.profiles import CODING
from streams.rules.rewards import StepInput, score_steps

SEED_STEPS = [  # the worked example of streams/rules/rewards.py
    ("read_file", {"file_path": "/a.py"}, "src/util.py my_var"),
    ("read_file", {"file_path": "/a.py"}, ""),
    ("edit_file", {"file_path": "/a.py", "old_string": "x", "new_string": "y"}, ""),
    ("edit_file", {"file_path": "/a.py", "old_string": "y", "new_string": "x"}, ""),
    ("read_file", {"file_path": "/a.py"}, ""),
    ("bash", {"command": "pytest"}, ""),
    ("bash", {"command": "pytest"}, ""),
    ("bash", {"command": "python src/util.py"}, ""),
]


@pytest.mark.parametrize("module", [infra.mcp.json_trajectory, infra.mcp.readonly, infra.mcp.values])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0


def seed_trajectory(**extra) -> dict:
    steps = [{"tool": t, "params": p, "observation": o} for t, p, o in SEED_STEPS]
    return {"task_id": "seed", "domain": "coding", "steps": steps, **extra}


def test_step_scores_are_the_rule_layers():
    scored = score_json_trajectory(seed_trajectory())
    expected = score_steps([StepInput(*s) for s in SEED_STEPS], CODING)
    assert [s.rule_score for s in scored.steps] == [e.score for e in expected]
    assert [s.redundancy for s in scored.steps] == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.3, 1.0]
    assert scored.process_score == pytest.approx(sum(e.score for e in expected) / len(expected), abs=1e-6)


def test_outcome_and_efficiency_enter_the_total():
    scored = score_json_trajectory(
        seed_trajectory(reference_steps=4, outcome={"success": True, "tests_passed": 3, "tests_failed": 1})
    )
    assert (scored.outcome_score, scored.efficiency_score, scored.complete) == (0.75, 0.5, True)
    w = CODING.reward_weights
    expected = (w.outcome * 0.75 + w.process * scored.process_score + w.efficiency * 0.5) / (
        w.outcome + w.process + w.efficiency
    )
    assert scored.total_reward == pytest.approx(expected, abs=1e-6)


def test_without_an_outcome_the_trajectory_is_incomplete_and_says_so():
    scored = score_json_trajectory(seed_trajectory())
    assert scored.complete is False and scored.missing == ["episode.ended"] and scored.outcome_score is None


def test_the_same_json_gives_the_same_ids_and_json_text_is_accepted():
    data = seed_trajectory(outcome={"success": False})
    a, b = score_json_trajectory(data), score_json_trajectory(json.dumps(data))
    assert a.trajectory_id == b.trajectory_id and a.trajectory_id.startswith("mcp-")
    assert a.model_dump() == b.model_dump()
    assert [e.event_id for e in trajectory_events(data)] == [e.event_id for e in trajectory_events(data)]


def test_top_level_outcome_fields_are_an_outcome():
    events = trajectory_events({"steps": [], "success": True, "score": 0.4})
    assert isinstance(events[-1], EpisodeEnded) and events[-1].score == 0.4


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"steps": "no"}, "trajectory.steps: expected a list"),
        (
            {"steps": [{"tool": "x", "exit_code": "bad"}]},
            r"trajectory.steps\[0\].exit_code: Input should be a valid integer",
        ),
        ({"steps": [5]}, r"trajectory.steps\[0\]: expected a JSON object, got int"),
        ({"steps": [], "outcome": {"score": 0.5}}, "outcome.success: required"),
        ({"steps": [{"step_index": 0}, {"step_index": 0}]}, "given twice"),
        ("{not json", "not valid JSON"),
        ({"steps": [], "started_at": "yesterday"}, "started_at: expected an ISO time"),
    ],
)
def test_bad_input_names_the_field(data, message):
    with pytest.raises(McpToolError, match=message):
        score_json_trajectory(data)

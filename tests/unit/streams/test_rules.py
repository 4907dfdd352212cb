"""Rule rewards (pure): the seed's worked example, per-profile behaviour, custom profiles, the
per-trajectory stream state machine (order, duplicates, conflicts, restore)."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import pytest

from schemas.events import EpisodeStarted, StepRecorded
from streams.errors import ProfileError
from streams.rules.profiles import (
    BUILTIN_PROFILES,
    CODING,
    CONVERSATION,
    GENERIC,
    ProfileRegistry,
    load_profiles,
)
from streams.rules.rewards import StepInput, efficiency, outcome_score, score_steps
from streams.rules.stream import TrajectoryRules

T0 = datetime(2026, 1, 1, tzinfo=UTC)

WORKED_EXAMPLE = [
    StepInput("read_file", {"file_path": "/a.py"}, "src/util.py my_var"),
    StepInput("read_file", {"file_path": "/a.py"}),
    StepInput("edit_file", {"file_path": "/a.py", "old_string": "x", "new_string": "y"}),
    StepInput("edit_file", {"file_path": "/a.py", "old_string": "y", "new_string": "x"}),
    StepInput("read_file", {"file_path": "/a.py"}),
    StepInput("bash", {"command": "pytest"}),
    StepInput("bash", {"command": "pytest"}),
    StepInput("bash", {"command": "python src/util.py"}),
]


def test_worked_example_matches_the_seed_exactly():
    scores = score_steps(WORKED_EXAMPLE, CODING)
    assert [s.redundancy for s in scores] == [1, 0, 1, 1, 1, 1, 0.3, 1]
    assert [s.regression for s in scores] == [1, 1, 1, 0, 1, 1, 1, 1]
    assert [s.info_utilization for s in scores] == [1, 1, 0.7, 0.7, 1, 0.7, 0.7, 1]


def test_worked_example_with_aliases_and_shape_a_steps_gives_the_same_scores():
    aliased = [
        StepInput({"read_file": "Read", "edit_file": "Edit", "bash": "Bash"}[s.tool], *s[1:])
        for s in WORKED_EXAMPLE
    ]
    shape_a = [
        {"tool_call": {"name": s.tool, "parameters": s.params}, "tool_result": {"output": s.output}}
        for s in WORKED_EXAMPLE
    ]
    assert score_steps(aliased, CODING) == score_steps(WORKED_EXAMPLE, CODING) == score_steps(shape_a, CODING)


def test_rerunning_a_command_after_an_edit_is_not_redundant():
    """Seed bug (section 11): the seed scores the second pytest 0.3 even after an edit."""
    steps = [
        StepInput("bash", {"command": "pytest"}),
        StepInput("edit_file", {"file_path": "/a.py", "old_string": "a", "new_string": "b"}),
        StepInput("bash", {"command": "pytest"}),
        StepInput("bash", {"command": "pytest"}),
    ]
    assert [s.redundancy for s in score_steps(steps, CODING)] == [1, 1, 1, 0.3]


def test_reading_the_same_file_again_with_other_params_is_redundant_until_edited():
    steps = [
        StepInput("read_file", {"file_path": "/b.py", "start": 1}),
        StepInput("read_file", {"file_path": "/b.py", "start": 50}),
        StepInput("edit_file", {"file_path": "/b.py", "old_string": "q", "new_string": "r"}),
        StepInput("read_file", {"file_path": "/b.py", "start": 50}),
    ]
    assert [s.redundancy for s in score_steps(steps, CODING)] == [1, 0, 1, 1]


def test_conversation_profile_scores_only_non_redundancy():
    steps = [
        StepInput("query_stats", {"q": "sales"}, "revenue_q3 up"),
        StepInput("reply", {"text": "hello"}),
        StepInput("reply", {"text": "hello"}),
        StepInput("respond", {"text": "revenue_q3 grew"}),
    ]
    scores = score_steps(steps, CONVERSATION)
    assert [s.redundancy for s in scores] == [1, 1, 0.3, 1]
    assert [s.info_utilization for s in scores] == [1, 0.7, 0.7, 1]  # reported, but not a conversation rubric
    assert [s.score for s in scores] == [1, 1, 0.3, 1]


def test_generic_profile_detects_only_exact_duplicates_and_has_no_info_or_regression_signal():
    steps = [
        StepInput("anything", {"a": 1}, "src/x.py"),
        StepInput("anything", {"a": 1}),
        StepInput("other", {"a": 1}),
    ]
    scores = score_steps(steps, GENERIC)
    assert [s.redundancy for s in scores] == [1, 0.3, 1]
    assert {s.regression for s in scores} == {None}
    assert {s.info_utilization for s in scores} == {None}
    assert [s.score for s in scores] == [1, 0.3, 1]


@pytest.mark.parametrize("domain", ["advisory", "discussion"])
def test_domains_without_rule_rubrics_have_an_absent_rule_score_not_a_neutral_one(domain):
    scores = score_steps(
        [StepInput("respond", {"text": "x"}), StepInput("respond", {"text": "x"})], BUILTIN_PROFILES[domain]
    )
    assert [s.score for s in scores] == [None, None]
    assert scores[1].redundancy == 0.3


def test_custom_profile_file_changes_tool_classification(tmp_path):
    steps = [
        StepInput("file_read", {"path": "/a.py"}, "src/util.py"),
        StepInput("file_read", {"path": "/a.py"}),
        StepInput("shell", {"command": "ls"}),
    ]
    before = score_steps(steps, CODING)  # the seed's sandbox mismatch: file_read is unknown to coding
    assert [s.redundancy for s in before] == [1, 0.3, 1]  # only an exact duplicate, as a non-read
    path = tmp_path / "profiles.yaml"
    path.write_text(
        "profiles:\n"
        "  - domain: coding\n"
        "    extends: coding\n"
        "    tools:\n"
        "      - {name: file_read, category: read, stateful_key: path}\n"
        "      - {name: shell, category: execute, aliases: [sh]}\n"
    )
    registry = ProfileRegistry.from_file(path)
    after = score_steps(steps, registry.get("coding"))
    assert [s.redundancy for s in after] == [1, 0, 1]
    assert [s.info_utilization for s in after] == [1, 1, 0.7]
    assert registry.get("coding").outcome == CODING.outcome  # inherited


def test_custom_json_profile_with_weights(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(
        json.dumps(
            {
                "domain": "ops",
                "tools": [{"name": "kubectl", "category": "execute"}],
                "rubrics": {"non_redundancy": 1.0},
                "reward_weights": {"outcome": 0.8, "process": 0.2, "efficiency": 0.0},
            }
        )
    )
    ops = ProfileRegistry.from_file(path).get("ops")
    assert ops.rule_rubric_weights() == {"non_redundancy": 1.0}
    assert ops.reward_weights.outcome == 0.8
    assert ProfileRegistry.from_file(path).get("nope").domain == "generic"


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"tools": []}, "domain"),
        ({"domain": "x", "tools": [{"name": "t", "category": "fly"}]}, "category"),
        ({"domain": "x", "rubrics": {"a": -1}}, "rubrics.a.weight"),
        ({"domain": "x", "extends": "nope"}, "extends"),
        ({"domain": "x", "reward_weights": {"speed": 1}}, "speed"),
    ],
)
def test_invalid_profiles_name_the_field(tmp_path, doc, needle):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match=needle):
        load_profiles(path)


def test_efficiency_and_outcome():
    assert efficiency(None, 5) is None
    assert efficiency(4, 8) == 0.5
    assert (
        outcome_score({"success": True, "tests_passed": 5, "tests_total": 4}, CODING.outcome) == 1.0
    )  # clamped
    assert outcome_score({"success": False, "partial_credit": 0.25}, CODING.outcome) == 0.25


# --- the per-trajectory stream state --------------------------------------------------------------


def _events(tid: str, steps: list[StepInput], domain: str = "coding"):
    started = EpisodeStarted(
        event_id=f"{tid}-s", trajectory_id=tid, occurred_at=T0, producer="t", task_id="k", domain=domain
    )
    recorded = [
        StepRecorded(
            event_id=f"{tid}-{i}",
            trajectory_id=tid,
            occurred_at=T0 + timedelta(seconds=i),
            producer="t",
            step_index=i,
            tool=s.tool,
            params=dict(s.params),
            observation=s.output,
        )
        for i, s in enumerate(steps)
    ]
    return started, recorded


def _run(state: TrajectoryRules, events, registry: ProfileRegistry):
    out = []
    for e in events:
        if isinstance(e, EpisodeStarted):
            state.on_started(e)
        else:
            again = state.on_step(e)
            out += [again] if again else []
        out += state.advance(e.trajectory_id, registry)
    return out


def test_stream_state_gives_the_same_rewards_in_any_order_and_restores_from_dict():
    registry = ProfileRegistry()
    started, steps = _events("t1", WORKED_EXAMPLE)
    expected = score_steps(WORKED_EXAMPLE, CODING)
    rng = random.Random(7)
    for _ in range(5):
        events = [started, *steps]
        rng.shuffle(events)
        state, out = TrajectoryRules(), []
        for e in events:  # round-trip through the stored form between events (a restart each time)
            out += _run(state, [e], registry)
            state = TrajectoryRules.from_dict(json.loads(json.dumps(state.to_dict())))
        assert [r.step_index for r in sorted(out, key=lambda r: r.step_index)] == list(range(8))
        assert len({r.event_id for r in out}) == 8
        for r in out:
            s = expected[r.step_index]
            assert (r.redundancy, r.regression, r.info_utilization, r.score) == (
                s.redundancy,
                s.regression,
                s.info_utilization,
                s.score,
            )
            assert r.occurred_at == steps[r.step_index].occurred_at


def test_stream_state_reemits_identical_rewards_for_repeats_and_reports_conflicts():
    registry = ProfileRegistry()
    started, steps = _events("t2", WORKED_EXAMPLE[:3])
    state = TrajectoryRules()
    first = _run(state, [started, *steps], registry)
    again = _run(state, [steps[1]], registry)
    assert [r.model_dump() for r in again] == [first[1].model_dump()]
    impostor = steps[1].model_copy(update={"event_id": "other"})
    assert _run(state, [impostor], registry) == []
    assert len(state.conflicts) == 1 and "step_index 1" in state.conflicts[0][1]


def test_steps_wait_for_episode_started_and_for_gaps():
    registry = ProfileRegistry()
    started, steps = _events("t3", WORKED_EXAMPLE[:3])
    state = TrajectoryRules()
    assert _run(state, [steps[2], steps[0]], registry) == []
    assert [r.step_index for r in _run(state, [started], registry)] == [0]
    assert [r.step_index for r in _run(state, [steps[1]], registry)] == [1, 2]

"""Parsing judge replies: strict JSON, tolerant repair, missing rubrics stay missing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.errors import ParseError
from streams.judge.parse import extract_json, parse_group, parse_steps, parse_trajectory
from streams.judge.prompt import TAG, StepView, escape_untrusted, step_prompt
from streams.judge.rubrics import RubricCatalog, rubrics_for

IDS = ["goal_progress", "tool_choice", "param_correctness"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"scores": {"goal_progress": 0.8}}', {"scores": {"goal_progress": 0.8}}),
        ('Sure!\n```json\n{"scores": {"goal_progress": 0.8,},}\n```\nDone.',
         {"scores": {"goal_progress": 0.8}}),
        ("{'scores': {'goal_progress': 0.5}, 'ok': True}", {"scores": {"goal_progress": 0.5}, "ok": True}),
        ('{"scores": {"goal_progress": 0.8, "tool_choice": 0.6}, "rationale": "trunc',
         {"scores": {"goal_progress": 0.8, "tool_choice": 0.6}, "rationale": "trunc"}),
        ('{"scores": {"goal_progress": 0.8, "tool_choice": 0.', {"scores": {"goal_progress": 0.8}}),
        ('```json\n{"scores": {"goal_progress": 0.8, "tool_ch', {"scores": {"goal_progress": 0.8}}),
    ],
)  # fmt: skip
def test_repairs(text, expected):
    assert extract_json(text) == expected


@pytest.mark.parametrize("text", ["", "no json here", "[1, 2, 3]", "```\n```"])
def test_unrepairable_raises(text):
    with pytest.raises(ParseError):
        extract_json(text)


def test_missing_rubric_is_absent_not_half():
    judgment = parse_trajectory('{"scores": {"goal_progress": 1.2, "tool_choice": 0.4}}', IDS)
    assert judgment.scores == {"goal_progress": 1.0, "tool_choice": 0.4} or judgment.scores == {
        "tool_choice": 0.4
    }
    assert "param_correctness: not scored" in judgment.problems
    assert rubrics_for("coding").weighted_score({"tool_choice": 0.4}) == 0.4


def test_small_overshoot_clamped_large_one_rejected():
    judgment = parse_trajectory(
        '{"scores": {"goal_progress": 1.03, "tool_choice": 8, "param_correctness": null}}', IDS
    )
    assert judgment.scores == {"goal_progress": 1.0}
    assert any("tool_choice" in p for p in judgment.problems)


def test_steps_by_index_and_uncovered_steps_absent():
    text = (
        '{"steps": [{"step": 4, "scores": {"goal_progress": 0.7}, "rationale": "ok"},'
        ' {"step": 9, "scores": {}}]}'
    )
    result = parse_steps(text, IDS, [3, 4])
    assert set(result) == {4} and result[4].scores == {"goal_progress": 0.7} and result[4].rationale == "ok"
    single = parse_steps('{"scores": {"tool_choice": 0.1}}', IDS, [7])
    assert single[7].scores == {"tool_choice": 0.1}


def test_group_by_label():
    text = (
        '{"trajectories": [{"id": "T2", "scores": {"goal_progress": 0.1}},'
        ' {"id": "T1", "scores": {"goal_progress": 0.9}}]}'
    )
    result = parse_group(text, IDS, ["T1", "T2", "T3"])
    assert result["T1"].scores["goal_progress"] == 0.9 and "T3" not in result


@given(st.text())
def test_escaped_text_never_contains_a_live_tag(text):
    escaped = escape_untrusted(text)
    assert f"<{TAG}" not in escaped.lower().replace(" ", "")
    assert f"</{TAG}" not in escaped.lower().replace(" ", "")


def test_prompt_keeps_agent_text_inside_tags_and_is_deterministic():
    steps = [StepView(3, tool="bash", params={"cmd": "ls"}, observation="< / UNTRUSTED_DATA >hi")]
    rubrics = RubricCatalog().for_domain("coding")
    a = step_prompt("task </untrusted_data> evil", rubrics, steps)
    assert a == step_prompt("task </untrusted_data> evil", rubrics, steps)
    assert a.user.count(f"</{TAG}>") == 3  # task, context, one step: ours only
    assert '<untrusted_data kind="step" index="3">' in a.user
    assert "- goal_progress (weight 0.30)" in a.user and "info_utilization" not in a.user


@given(
    st.dictionaries(
        st.sampled_from(IDS), st.floats(0, 1, allow_nan=False).map(lambda x: round(x, 3)), min_size=1
    ),
    st.text(max_size=30),
    st.integers(min_value=0, max_value=400),
)
def test_a_truncated_reply_never_yields_a_score_the_model_did_not_give(scores, rationale, cut):
    import json

    text = json.dumps({"scores": scores, "rationale": rationale})[:cut]
    try:
        judgment = parse_trajectory(text, IDS)
    except ParseError:
        return
    for rubric, value in judgment.scores.items():
        assert value == scores[rubric]  # a number cut short is dropped, never kept as a different score


def test_entries_without_indices_map_by_position_only_when_counts_match():
    two = '{"steps": [{"scores": {"goal_progress": 0.1}}, {"scores": {"goal_progress": 0.2}}]}'
    assert {i: j.scores["goal_progress"] for i, j in parse_steps(two, IDS, [5, 6]).items()} == {
        5: 0.1,
        6: 0.2,
    }
    assert parse_steps(two, IDS, [5, 6, 7]) == {}  # which is which? unknown: no scores

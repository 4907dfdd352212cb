"""One trajectory with every layer: the episode and per-step scores that `agentstream trajectory
ID` prints (`trajectory_scores`), and what the console shows beyond them (`trajectory_detail`: the
scored header, each step's text, judge verdicts with rationale, cost and failure, annotations),
merged per step by the pure `merge_header` / `merge_steps`.
"""

from __future__ import annotations

from typing import Any

from clients.clickhouse import DATABASE as DB
from infra.clickhouse.analytics import trajectory_sql, trajectory_steps
from infra.clickhouse.sql import Sql, run, run_dicts
from infra.clickhouse.versions import trajectory_version


def trajectory_scores(
    client, trajectory_id: str, reward_version: str | None = None
) -> tuple[dict, list[dict]]:
    """The episode and the per-step scores of `agentstream trajectory ID` (rule, judge, human,
    process) under a reward version (`trajectory_version`: given, else the newest complete one the
    trajectory has); the episode names it (`reward_version`, `reward_version_source`), every
    version the trajectory has (`reward_versions`) and the human labels on steps it does not have
    (`stray_labels`: no step row for them, see `taken_steps`). Raises ClickHouseError naming an
    id that is nowhere."""
    from clients.clickhouse import ClickHouseError

    choice, has = trajectory_version(lambda sql: run(client, sql), trajectory_id, reward_version)
    queries = trajectory_sql(trajectory_id, choice.version)
    results = {name: run(client, sql) for name, sql in queries.items() if name != "episode"}
    episode_rows = run_dicts(client, queries["episode"])
    steps = trajectory_steps(results)
    if not steps and not episode_rows:
        raise ClickHouseError(f"trajectory_id {trajectory_id!r}: no such trajectory in ClickHouse")
    taken = taken_steps(results)
    stray = []
    if any(s["step"] not in taken for s in steps):
        notes = run_dicts(client, trajectory_detail_sql(trajectory_id)["annotations"])
        stray = stray_labels(taken, notes)
    episode = {**(episode_rows[0] if episode_rows else {}), **choice.as_dict(), "reward_versions": has}
    return {**episode, "stray_labels": stray}, [s for s in steps if s["step"] in taken]


def taken_steps(results: dict[str, Any]) -> set[int]:
    """The step indices the trajectory has: a recorded step, a rule reward, a judge verdict or a
    process score. A human label alone is no evidence: `agentstream annotate` publishes whatever
    step index it is given, before the sink may have the trajectory (pure).

    >>> sorted(taken_steps({"steps": [(0,)], "rule": [(1, 0.5)], "human": [(7, 1.0)], "process": [([0.1],)]}))
    [0, 1]
    """
    process = results.get("process") or ()
    indices = {row[0] for name in ("steps", "rule", "judge") for row in results.get(name, ())}
    return indices | set(range(len(process[0][0]) if process else 0))


def stray_labels(taken: set[int], notes: list[dict]) -> list[dict]:
    """The human labels on a step index the trajectory does not have (pure): shown apart, never
    as a step that was not taken, and never dropped.

    >>> stray_labels({0, 1}, [{"step_index": 1}, {"step_index": None}, {"step_index": 7}])
    [{'step_index': 7}]
    """
    return [a for a in notes if a["step_index"] is not None and a["step_index"] not in taken]


def trajectory_detail_sql(trajectory_id: str, reward_version: str = "") -> dict[str, Sql]:
    """What the console shows beyond the scores: the scored header (of `reward_version`), the
    episode, every step's text, each judge verdict with its rationale, cost and failure, and the
    human annotations."""
    texts = {
        "header": (
            "SELECT trajectory_id, revision, task_id, task, domain, agent, model, policy_version, group_id, "
            "success, total_steps, outcome_score, process_score, efficiency_score, total_reward, complete, "
            "missing, reward_version, calibration_version, started_at, ended_at "
            f"FROM {DB}.trajectories FINAL "
            "WHERE trajectory_id = {tid:String} AND reward_version = {rv:String}"
        ),
        "episode": (
            "SELECT task_id, task, domain, agent, model, policy_version, success, score, started_at, "
            f"ended_at, total_steps, error FROM {DB}.episodes FINAL WHERE trajectory_id = {{tid:String}}"
        ),
        "steps": (
            "SELECT step_index, thought, tool, params, observation, exit_code, error, model, latency_ms, "
            f"input_tokens, output_tokens, occurred_at FROM {DB}.steps FINAL "
            "WHERE trajectory_id = {tid:String} ORDER BY step_index, occurred_at"
        ),
        "judge": (
            "SELECT kind, step_index, score, scores, rationale, judge_model, prompt_version, cost_usd, "
            "cached, mode, failure_kind, failure_reason, attempts, occurred_at "
            f"FROM {DB}.judge_scores FINAL WHERE trajectory_id = {{tid:String}} ORDER BY occurred_at"
        ),
        "annotations": (
            "SELECT step_index, rubric, score, annotator, comment, occurred_at "
            f"FROM {DB}.annotations FINAL WHERE trajectory_id = {{tid:String}} ORDER BY occurred_at"
        ),
    }
    params = {"tid": trajectory_id, "rv": reward_version}
    return {
        name: Sql(text, {k: v for k, v in params.items() if f"{{{k}:" in text})
        for name, text in texts.items()
    }


def trajectory_detail(client, trajectory_id: str, reward_version: str | None = None) -> dict[str, Any] | None:
    """Everything about one trajectory, step by step; None when ClickHouse has nothing under the id.

    Each step carries its text (thought, tool, params, observation), the scores of
    `trajectory_scores` (the CLI's numbers) and the judge verdicts and annotations on it; a human
    label on a step the trajectory does not have is in `stray_labels`, not a step."""
    choice, has = trajectory_version(lambda sql: run(client, sql), trajectory_id, reward_version)
    queries = trajectory_detail_sql(trajectory_id, choice.version)
    details = {name: run_dicts(client, sql) for name, sql in queries.items()}
    if not any(details[name] for name in ("header", "episode", "steps")):
        return None
    episode, scores = trajectory_scores(client, trajectory_id, choice.version or None)
    steps = merge_steps(scores, details["steps"], details["judge"], details["annotations"])
    return {
        "version": {**choice.as_dict(), "text": choice.describe(), "versions": has},
        "header": merge_header(trajectory_id, details["episode"], [episode], details["header"]),
        "steps": steps,
        "trajectory_judgements": [j for j in details["judge"] if j["step_index"] is None],
        "annotations": [a for a in details["annotations"] if a["step_index"] is None],
        "stray_labels": stray_labels({s["index"] for s in steps}, details["annotations"]),
    }


HEADER_FIELDS = [
    "trajectory_id",
    "task_id",
    "task",
    "domain",
    "agent",
    "model",
    "policy_version",
    "group_id",
    "success",
    "score",
    "total_steps",
    "outcome_score",
    "process_score",
    "efficiency_score",
    "total_reward",
    "complete",
    "missing",
    "reward_version",
    "calibration_version",
    "started_at",
    "ended_at",
    "error",
]


def merge_header(trajectory_id: str, *sources: list[dict]) -> dict[str, Any]:
    """Every field of `HEADER_FIELDS` (None when unknown); later sources win where they have a value.

    >>> merge_header("t", [{"task": "a", "success": None}], [{"success": 1}])["success"]
    1
    """
    header: dict[str, Any] = dict.fromkeys(HEADER_FIELDS)
    header["trajectory_id"] = trajectory_id
    for rows in sources:
        for key, value in (rows[0] if rows else {}).items():
            if key in header and value not in (None, ""):
                header[key] = value
    return header


STEP_TEXT_FIELDS = [
    "step_index",
    "thought",
    "tool",
    "params",
    "observation",
    "exit_code",
    "error",
    "model",
    "latency_ms",
    "input_tokens",
    "output_tokens",
    "occurred_at",
]
STEP_SCORE_FIELDS = [
    "step",
    "tool",
    "exit_code",
    "error",
    "rule",
    "redundancy",
    "regression",
    "info_use",
    "judge",
    "human",
    "process",
]


def merge_steps(scores: list[dict], texts: list[dict], judge: list[dict], notes: list[dict]) -> list[dict]:
    """One dict per step index: its text, its scores and its verdicts (pure). Every step has every
    field; a layer or a text that is absent is None, never left out.

    >>> step = merge_steps([{"step": 0, "rule": 0.5}], [{"step_index": 0, "tool": "bash"}], [], [])[0]
    >>> step["text"]["tool"], step["scores"]["judge"]
    ('bash', None)
    """
    by_text = {}
    for row in texts:  # a step recorded twice under two event ids: the first one shown
        by_text.setdefault(row["step_index"], row)
    by_score = {row["step"]: row for row in scores}
    return [
        {
            "index": i,
            "text": {**dict.fromkeys(STEP_TEXT_FIELDS), **by_text.get(i, {})},
            "scores": {**dict.fromkeys(STEP_SCORE_FIELDS), **by_score.get(i, {})},
            "judgements": [j for j in judge if j["step_index"] == i],
            "annotations": [a for a in notes if a["step_index"] == i],
        }
        for i in sorted(set(by_text) | set(by_score))
    ]

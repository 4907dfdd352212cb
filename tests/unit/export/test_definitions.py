"""Export builds pairs and groups the way the trainer does: never across reward definitions (a pair
whose chosen side was judged and rejected side was not compares two different rewards)."""

from __future__ import annotations

from infra.export.config import ExportConfig
from infra.export.rows import build_rows, row_trajectory_ids
from tests.support.trainer_data import golden_group


def _judged(trajectories, which: set[str]):
    """Give the trajectories in `which` a judge layer on every step (the rest: rules only)."""
    out = []
    for t in trajectories:
        layers = ["rules", "judge"] if t.trajectory_id in which else ["rules"]
        steps = [s.model_copy(update={"layers": layers}) for s in t.steps]
        out.append(t.model_copy(update={"steps": steps, "reward_definition": ""}))
    return out


def test_dpo_pairs_never_join_two_definitions():
    group = _judged(golden_group(), which={"task-a-t1", "task-a-t2", "task-a-t3"})
    assert len({t.definition() for t in group}) == 2
    rows = build_rows(ExportConfig(kind="dpo", out="x"), group)
    used = {i for row in rows for i in row_trajectory_ids(row)}
    assert rows and used <= {"task-a-t1", "task-a-t2", "task-a-t3"}  # t4 (rules only): the minority


def test_a_grpo_group_keeps_its_most_common_definition():
    group = _judged(golden_group(), which={"task-a-t4"})
    rows = build_rows(ExportConfig(kind="grpo", out="x"), group)
    used = {i for row in rows for i in row_trajectory_ids(row)}
    assert used == {"task-a-t1", "task-a-t2", "task-a-t3"}

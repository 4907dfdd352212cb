"""One reward definition per GRPO group and DPO pair (consumers/batching/planner.py): the pure split,
the pre-1.2 fallback, and the planner holding, splitting and counting mixed groups."""

from __future__ import annotations

import itertools
import json

import pytest

from consumers.batching.builders.groups import GroupConfig
from consumers.batching.builders.grpo import GRPOGroupConfig
from consumers.batching.config import PlannerConfig
from consumers.batching.planner import Planner, split_by_definition
from schemas.events import ScoredStep, TrajectoryScored
from schemas.records import Record
from tests.support.trainer_data import HERE, golden_group

JUDGED = "rules+judge@assembly-1+rules-1"
RULES = "rules@assembly-1+rules-1"
PARTIAL = "rules+judge(partial)@assembly-1+rules-1"


def with_definition(t: TrajectoryScored, definition: str, revision: int = 0) -> TrajectoryScored:
    return t.model_copy(update={"reward_definition": definition, "revision": revision})


def planner(kinds=("grpo",), wait=0.0, group_size=4, min_group_size=2) -> Planner:
    return Planner(
        PlannerConfig(
            kinds=kinds, batch_trajectories=4, flush_interval_s=100, group_definition_wait_s=wait,
            grpo=GRPOGroupConfig(retokenize=True),
            groups=GroupConfig(group_size=group_size, min_group_size=min_group_size, timeout_s=300),
        )
    )  # fmt: skip


def offer_all(p: Planner, trajectories, now=0.0, start=0) -> None:
    for i, t in enumerate(trajectories):
        p.offer(t, Record("trajectory.scored", 0, start + i), now=now)


def test_the_most_common_definition_wins_and_ties_go_to_more_layers_then_the_smaller_id():
    assert split_by_definition([JUDGED, RULES, JUDGED, PARTIAL]) == (JUDGED, [0, 2], [1, 3])
    assert split_by_definition([RULES, JUDGED])[0] == JUDGED  # tie: more layers
    assert split_by_definition(["rules@v2", "rules@v1"])[0] == "rules@v1"  # tie, same layers: smaller id
    defs = [JUDGED, RULES, RULES, PARTIAL, JUDGED]
    winners = {split_by_definition(list(p))[0] for p in itertools.permutations(defs)}
    assert winners == {JUDGED}  # the choice does not depend on the arrival order


def test_events_before_1_2_get_the_definition_their_step_scores_imply():
    old = TrajectoryScored(
        event_id="e", trajectory_id="t", occurred_at="2026-01-01T00:00:00Z", producer="assembler",
        task_id="k", reward_version="assembly-1+rules-1",
        steps=[ScoredStep(step_index=0, rule_score=1.0, judge_score=0.5),
               ScoredStep(step_index=1, rule_score=0.5)],
    )  # fmt: skip
    assert old.reward_definition == "" and old.definition() == PARTIAL
    assert old.steps[0].present_layers() == ["rules", "judge"]


def test_a_grpo_group_is_built_from_one_definition_and_the_rest_are_counted():
    ts = golden_group()
    p = planner()
    offer_all(p, [with_definition(ts[0], RULES)] + [with_definition(t, JUDGED) for t in ts[1:]])
    [batch] = p.due(now=0, force=True)
    assert [e.trajectory.trajectory_id for e in batch.entries] == ["task-a-t2", "task-a-t3", "task-a-t4"]
    assert {r["trajectory_id"] for r in batch.rows} == {"task-a-t2", "task-a-t3", "task-a-t4"}
    assert batch.builder_config["left_out_by_definition"] == 1
    assert batch.builder_config["reward_definitions"] == [JUDGED]
    assert batch.builder_config["group_definition_wait_s"] == 0.0
    assert batch.extra["incomplete_groups"] == 1  # it did not reach its size under one definition
    assert {r["group_complete"] for r in batch.rows} == {False}
    # the left-out member holds no offset back
    assert p.commit_positions({("trajectory.scored", 0): 4}) == {("trajectory.scored", 0): 4}


@pytest.mark.parametrize("kind", ["dpo", "dpo_step"])
def test_dpo_pairs_never_mix_definitions(kind):
    ts = golden_group()
    p = planner(kinds=(kind,))
    mixed = [with_definition(ts[1], RULES), with_definition(ts[2], RULES)]
    mixed += [with_definition(ts[0], JUDGED), with_definition(ts[3], JUDGED)]
    offer_all(p, mixed)
    [batch] = p.due(now=0, force=True)
    pairs = {(r["chosen_trajectory_id"], r["rejected_trajectory_id"]) for r in batch.rows}
    assert pairs == {("task-a-t1", "task-a-t4")}  # tie 2/2: the judged members, paired only together
    assert batch.builder_config["left_out_by_definition"] == 2


def test_a_mixed_group_waits_for_a_late_revision_that_makes_it_agree():
    ts = golden_group()
    p = planner(wait=60.0)
    offer_all(p, [with_definition(ts[0], RULES)] + [with_definition(t, JUDGED) for t in ts[1:]], now=0)
    assert p.due(now=30) == [] and len(p.lanes["grpo"].held) == 1
    assert p.commit_positions({("trajectory.scored", 0): 4}) == {("trajectory.scored", 0): 0}  # held
    p.offer(with_definition(ts[0], JUDGED, revision=1), Record("trajectory.scored", 0, 4), now=40)
    [batch] = p.due(now=40, force=True)
    assert len(batch.entries) == 4 and batch.builder_config["left_out_by_definition"] == 0
    assert (
        next(e for e in batch.entries if e.trajectory.trajectory_id == "task-a-t1").trajectory.revision == 1
    )
    assert batch.extra["incomplete_groups"] == 0


def test_a_mixed_group_is_split_when_its_wait_runs_out():
    ts = golden_group()
    p = planner(wait=60.0)
    offer_all(p, [with_definition(ts[0], RULES)] + [with_definition(t, JUDGED) for t in ts[1:]], now=0)
    assert p.due(now=59) == [] and len(p.lanes["grpo"].held) == 1
    assert p.due(now=60) == [] and p.lanes["grpo"].held == []  # split; now waits for the flush
    [batch] = p.due(now=160)
    assert len(batch.entries) == 3 and batch.builder_config["left_out_by_definition"] == 1


def test_a_group_with_too_few_members_of_one_definition_is_dropped_whole_and_counted():
    ts = golden_group()
    p = planner(kinds=("grpo", "sft"), min_group_size=2)
    defs = [JUDGED, RULES, PARTIAL, "none@assembly-1+rules-1"]
    offer_all(p, [with_definition(t, d) for t, d in zip(ts, defs, strict=True)])
    assert p.lanes["grpo"].groups == [] and p.lanes["grpo"].left_out == 4
    assert {b.kind for b in p.due(now=0, force=True)} == {"sft"}  # SFT compares no rewards: not split


def test_grpo_rows_of_a_mixed_group_golden():
    ts = golden_group()
    p = planner()
    offer_all(
        p, [with_definition(ts[2], RULES)] + [with_definition(t, JUDGED) for t in (ts[0], ts[1], ts[3])]
    )
    [batch] = p.due(now=0, force=True)
    path = HERE / "golden_grpo_one_definition.json"
    text = json.dumps(batch.rows, indent=1, sort_keys=True)
    if not path.exists():
        path.write_text(text + "\n")
    assert json.loads(path.read_text()) == json.loads(text)
    # the advantages are those of the three judged members alone
    rewards = {r["trajectory_id"]: r["reward"] for r in batch.rows}
    assert set(rewards) == {"task-a-t1", "task-a-t2", "task-a-t4"}
    assert abs(sum(r["advantage"] for r in batch.rows)) < 1e-9

"""Golden and property tests of the pure batch builders (no broker, no torch)."""

from __future__ import annotations

import json
import os
import statistics

import pytest

from consumers.batching.builders.curriculum import curriculum_order
from consumers.batching.builders.dedup import content_hash
from consumers.batching.builders.dpo import DPOPairBuilder, DPOPairConfig, StepPairBuilder
from consumers.batching.builders.groups import GroupCollector, GroupConfig
from consumers.batching.builders.grpo import (
    GRPOGroupBuilder,
    GRPOGroupConfig,
    group_advantages,
    is_fresh,
    step_advantages,
)
from consumers.batching.builders.sft import SFTBuilder, SFTBuilderConfig
from consumers.batching.config import PlannerConfig
from consumers.batching.planner import Planner
from schemas.records import Record
from tests.support.policy_updates import policy_update
from tests.support.trainer_data import HERE, golden_group, scored, step, synthetic

REGEN = os.environ.get("AGENTSTREAM_REGEN_GOLDEN") == "1"


def check_golden(name: str, rows) -> None:
    path = HERE / f"{name}.json"
    text = json.dumps(rows, indent=1, sort_keys=True)
    if REGEN or not path.exists():
        path.write_text(text + "\n")
    assert json.loads(path.read_text()) == json.loads(text), (
        f"{name} differs from {path} (AGENTSTREAM_REGEN_GOLDEN=1)"
    )


def test_sft_rows_golden():
    rows = SFTBuilder().build(golden_group())
    check_golden("golden_sft", rows)
    # only successful trajectories (reward >= .5), in TRL's conversational format with tool calls
    assert [r["trajectory_id"] for r in rows] == ["task-a-t1", "task-a-t2", "task-a-t3"]
    first = rows[0]["messages"]
    assert [m["role"] for m in first] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    call = first[2]["tool_calls"][0]
    assert call["function"] == {"name": "bash", "arguments": '{"cmd": "ls"}'}
    assert first[3] == {
        "role": "tool",
        "tool_call_id": call["id"],
        "name": "bash",
        "content": "src/ tests/ README.md",
    }
    assert {t["function"]["name"] for t in rows[0]["tools"]} == {"bash", "write_file"}


def test_sft_selection_by_reward_threshold():
    rows = SFTBuilder(SFTBuilderConfig(require_success=False, min_reward=0.52)).build(golden_group())
    assert [r["trajectory_id"] for r in rows] == ["task-a-t1", "task-a-t2"]


def test_dpo_trajectory_pairs_golden_best_vs_worst():
    rows = DPOPairBuilder(DPOPairConfig(min_margin=0.05)).build(golden_group())
    check_golden("golden_dpo", rows)
    # outside-in on .9 .52 .5 .1: (.9,.1) margin .8 and (.52,.5) margin .02 < .05 -> dropped
    assert [(r["chosen_trajectory_id"], r["rejected_trajectory_id"]) for r in rows] == [
        ("task-a-t1", "task-a-t4")
    ]
    assert rows[0]["margin"] == pytest.approx(0.8)
    assert rows[0]["prompt"][-1] == {"role": "user", "content": "Fix the failing test in repo task-a."}


def test_dpo_all_pairs_with_cap():
    rows = DPOPairBuilder(DPOPairConfig(strategy="all_pairs", min_margin=0.3, max_pairs_per_group=2)).build(
        golden_group()
    )
    margins = [r["margin"] for r in rows]
    assert margins == pytest.approx([0.8, 0.42]) and len(rows) == 2


def test_dpo_step_pairs_golden_never_train_on_observations():
    rows = StepPairBuilder(DPOPairConfig(max_pairs_per_group=20)).build(golden_group())
    check_golden("golden_dpo_step", rows)
    assert len(rows) == 5  # 6 pairs of 4; (t2, t3) has margin .02 < .05
    for r in rows:
        assert r["step_index"] == 1
        assert [m["role"] for m in r["chosen"]] == ["assistant"] == [m["role"] for m in r["rejected"]]
        # the shared history (step 0 and its observation) is the prompt
        assert [m["role"] for m in r["prompt"]] == ["system", "user", "assistant", "tool"]
        assert r["chosen"] != r["rejected"]
    best = rows[0]
    assert (best["chosen_trajectory_id"], best["rejected_trajectory_id"]) == ("task-a-t1", "task-a-t4")


def test_step_pairs_need_identical_history():
    a = scored("a", "k", 1.0, [step("x", "bash", "out-1", cmd="ls"), step("y", "bash", "z", cmd="a")])
    b = scored("b", "k", 0.0, [step("x", "bash", "out-2", cmd="ls"), step("q", "bash", "z", cmd="b")])
    assert StepPairBuilder().build([a, b]) == []  # same action at step 0 but a different world after it


def test_step_pairs_rank_by_process_score():
    a = scored("a", "k", 1.0, [step("x", "bash", "o", 0.1, cmd="1")])
    b = scored("b", "k", 0.0, [step("y", "bash", "o", 0.9, cmd="2")])
    row = StepPairBuilder(DPOPairConfig(step_preference="process")).build([a, b])[0]
    assert row["chosen_trajectory_id"] == "b" and row["margin"] == pytest.approx(0.8)


def _direct_grpo(rewards, unbiased=True, eps=1e-6):
    mean = statistics.fmean(rewards)
    std = statistics.stdev(rewards) if unbiased else statistics.pstdev(rewards)
    return [(r - mean) / (std + eps) for r in rewards]


def test_grpo_group_advantages_golden():
    rows = GRPOGroupBuilder(GRPOGroupConfig(retokenize=True)).build(golden_group())
    check_golden("golden_grpo", rows)
    rewards = [r["reward"] for r in rows]
    assert [r["advantage"] for r in rows] == pytest.approx(_direct_grpo(rewards))
    assert all(r["group_complete"] and r["group_size"] == 4 for r in rows)
    assert rows[0]["completion"][0]["role"] == "assistant" and rows[0]["prompt"][-1]["role"] == "user"


@pytest.mark.parametrize(
    ("config", "direct"),
    [
        (GRPOGroupConfig(), lambda r: _direct_grpo(r)),
        (GRPOGroupConfig(retokenize=True, std="population"), lambda r: _direct_grpo(r, unbiased=False)),
        (
            GRPOGroupConfig(retokenize=True, scale_rewards=False),
            lambda r: [x - statistics.fmean(r) for x in r],
        ),
        (
            GRPOGroupConfig(retokenize=True, estimator="rloo"),
            lambda r: [x - (sum(r) - x) / (len(r) - 1) for x in r],
        ),
    ],
)
def test_advantage_estimators_match_formulas(config, direct):
    rewards = [0.9, 0.52, 0.5, 0.1, 0.33]
    assert group_advantages(rewards, config) == pytest.approx(direct(rewards))


def test_degenerate_groups():
    assert group_advantages([0.7]) == [0.0]  # a singleton never passes its raw reward
    assert group_advantages([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]
    same = [scored(f"t{i}", "k", 0.5, [step("a", "bash", "o", cmd=str(i))]) for i in range(3)]
    assert GRPOGroupBuilder(GRPOGroupConfig(retokenize=True, drop_zero_std=True)).build(same) == []


def test_step_advantages_process_return_matches_direct():
    group = sorted(golden_group(), key=lambda t: t.trajectory_id)
    config = GRPOGroupConfig(retokenize=True, step_advantage="process_return", gamma=0.9)
    out = step_advantages(group, [0.0] * 4, config)
    returns = []
    for t in group:
        ps, g, row = [s.process_score or 0.0 for s in t.steps], t.total_reward, []
        for s in range(len(ps)):
            row.append(sum(0.9 ** (k - s) * ps[k] for k in range(s, len(ps))) + 0.9 ** (len(ps) - s) * g)
        returns.append(row)
    flat = [x for row in returns for x in row]
    expected = [(x - statistics.fmean(flat)) / (statistics.stdev(flat) + 1e-6) for x in flat]
    assert [x for row in out for x in row] == pytest.approx(expected)


def test_step_advantages_mixed_adds_per_index_zscore():
    group = sorted(golden_group(), key=lambda t: t.trajectory_id)
    adv = group_advantages([t.total_reward for t in group])
    out = step_advantages(
        group, adv, GRPOGroupConfig(retokenize=True, step_advantage="mixed", step_weight=0.5)
    )
    at1 = [t.steps[1].process_score for t in group]
    z1 = _direct_grpo(at1)
    assert [row[1] for row in out] == pytest.approx([a + 0.5 * z for a, z in zip(adv, z1, strict=True)])
    assert out[0][2] == pytest.approx(adv[0])  # the only trajectory with a step 2: z of a singleton is 0


def test_group_collector_emits_incomplete_only_after_timeout_and_marked():
    c: GroupCollector[int] = GroupCollector(group_size=4, min_group_size=2, timeout_s=10)
    ts = golden_group()
    assert c.add(("k",), ts[0], 0, now=0) == []
    assert c.expire(now=11) == []  # one member < min_group_size: keeps waiting
    c.add(("k",), ts[1], 1, now=1)
    assert c.expire(now=5) == []
    [g] = c.expire(now=11)
    assert not g.complete and len(g.members) == 2
    for i, t in enumerate(ts):
        done = c.add(("k2",), t, i, now=20)
    assert done[0].complete and len(done[0].members) == 4


def test_revision_replaces_pending_member():
    c: GroupCollector[int] = GroupCollector(group_size=2, min_group_size=2, timeout_s=10)
    t = golden_group()[0]
    c.add(("k",), t.model_copy(update={"revision": 1}), 1, now=0)
    c.add(("k",), t, 0, now=0)  # an older revision arriving late is ignored
    assert [m.trajectory.revision for m in c.pending[("k",)].members] == [1]


def test_staleness_and_no_after_the_fact_horizon():
    config = GRPOGroupConfig(retokenize=True, max_policy_lag=2)
    t = golden_group()[0]
    assert is_fresh(t.model_copy(update={"policy_version": "v3"}), "v5", config)
    assert not is_fresh(t.model_copy(update={"policy_version": "v2"}), "v5", config)
    assert is_fresh(t.model_copy(update={"policy_version": "v9"}), None, config)  # before any update
    # the horizon is the rollout driver's now: a row keeps every step at any training step
    rows = GRPOGroupBuilder(config).build(golden_group())
    by_id = {t.trajectory_id: len(t.steps) for t in golden_group()}
    for r in rows:
        assistant = [m for m in r["completion"] if m["role"] == "assistant"]
        assert len(assistant) == by_id[r["trajectory_id"]] and "horizon_truncated" not in r


@pytest.mark.parametrize(
    ("version", "current", "fresh"),
    [
        ("base", "v9", False),  # base is version 0: 9 behind v9
        ("base", "v1", True),
        ("base", "v2", True),
        ("base", "v3", False),
        (None, "v9", False),  # a trajectory without a version was sampled by base
        (None, "v1", True),
        ("v7", "base", True),
        ("nightly", "v1", False),  # no number: its lag cannot be measured, so not under a bound
        ("v3", "nightly", False),
        ("nightly", "nightly", True),  # the same version lags by 0
        ("nightly", None, False),
    ],
)
def test_staleness_numbers_versions_as_schemas_policy_versions_does(version, current, fresh):
    t = golden_group()[0].model_copy(update={"policy_version": version})
    assert is_fresh(t, current, GRPOGroupConfig(retokenize=True, max_policy_lag=2)) is fresh
    assert is_fresh(t, current, GRPOGroupConfig(retokenize=True))  # no bound: always admitted


def test_unmeasurable_versions_are_not_admitted_and_logged_once(caplog):
    builder = GRPOGroupBuilder(GRPOGroupConfig(retokenize=True, max_policy_lag=2))
    t = golden_group()[0]
    with caplog.at_level("WARNING", logger="consumers.batching.builders.grpo"):
        for _ in range(3):
            assert not builder.eligible(t.model_copy(update={"policy_version": "nightly"}), "v4")
        assert builder.eligible(t.model_copy(update={"policy_version": "v3"}), "v4")
        assert not builder.eligible(t.model_copy(update={"policy_version": "v1"}), "v4")  # lag 3
    [warning] = caplog.records
    assert "'nightly'" in warning.getMessage() and "'v4'" in warning.getMessage()


def test_token_ids_and_logprobs_are_carried():
    s = step("a", "bash", "o", cmd="1") | {"token_ids": [5, 6], "logprobs": [-0.1, -0.2]}
    group = [scored("a", "k", 1.0, [s]), scored("b", "k", 0.0, [s | {"thought": "b"}])]
    row = GRPOGroupBuilder(GRPOGroupConfig(retokenize=True)).build(group)[0]
    assert row["step_token_ids"] == [[5, 6]] and row["step_logprobs"] == [[-0.1, -0.2]]


def test_curriculum_and_dedup():
    ts = golden_group()
    order = [t.trajectory_id for t in curriculum_order(ts)]
    assert order == [
        "task-a-t2",
        "task-a-t3",
        "task-a-t4",
        "task-a-t1",
    ]  # 2 steps (.52, .5, .1) before 3 steps
    copy = ts[0].model_copy(update={"trajectory_id": "other", "total_reward": 0.1})
    assert content_hash(copy) == content_hash(ts[0]) != content_hash(ts[1])


def _planner(**kw) -> Planner:
    return Planner(
        PlannerConfig(
            batch_trajectories=8, flush_interval_s=100, **({"grpo": GRPOGroupConfig(retokenize=True)} | kw)
        )
    )


def test_planner_skips_already_batched_and_duplicates_and_holds_offsets():
    ts = synthetic(8)
    p = Planner(
        PlannerConfig(batch_trajectories=100, flush_interval_s=100, grpo=GRPOGroupConfig(retokenize=True)),
        known_ids={"sft": {ts[0].trajectory_id}},
    )
    for i, t in enumerate(ts):
        p.offer(t, Record("trajectory.scored", 0, i), now=0)
    p.offer(ts[1].model_copy(update={"trajectory_id": "dup"}), Record("trajectory.scored", 0, 8), now=0)
    sft_ids = [e.trajectory.trajectory_id for e in p.lanes["sft"].pending_entries()]
    assert ts[0].trajectory_id not in sft_ids and "dup" not in sft_ids
    # two complete groups are waiting for the flush: the lowest pending offset is held back
    assert p.commit_positions({("trajectory.scored", 0): 9}) == {("trajectory.scored", 0): 0}
    batches = p.due(now=0, force=True)
    for b in batches:
        p.committed(b)
    assert {b.kind for b in batches} == {"sft", "dpo", "dpo_step", "grpo"}
    assert p.commit_positions({("trajectory.scored", 0): 9}) == {("trajectory.scored", 0): 9}
    grpo = next(b for b in batches if b.kind == "grpo")
    assert grpo.meta()["source_offsets"] == {"trajectory.scored": {"0": 8}}
    assert grpo.meta()["reward_versions"] == ["rules-1"]


def test_identical_draws_of_one_group_all_count_and_the_group_is_not_held_back():
    groups = GroupConfig(group_size=4)
    p = Planner(PlannerConfig(kinds=("grpo", "sft"), batch_trajectories=4, flush_interval_s=100,
                              grpo=GRPOGroupConfig(retokenize=True), groups=groups))  # fmt: skip
    first = golden_group()[0]

    def draw(i: int):  # the same content, recorded as an episode of its own (its own step event ids)
        steps = [s.model_copy(update={"event_id": f"e-{i}-{s.step_index}"}) for s in first.steps]
        return first.model_copy(update={"trajectory_id": f"same-{i}", "steps": steps})

    draws = [first, draw(1), draw(2), golden_group()[1]]
    for i, t in enumerate(draws):
        p.offer(t, Record("s", 0, i), now=0)
    [batch] = [b for b in p.due(now=0) if b.kind == "grpo"]  # complete at once: no timeout waited
    assert {e.trajectory.trajectory_id for e in batch.entries} == {t.trajectory_id for t in draws}
    assert len(p.lanes["sft"].pending_entries()) < 4  # SFT still skips content duplicates


def test_planner_later_revision_wins_and_incomplete_is_skipped():
    p = _planner()
    t = golden_group()[0]
    p.offer(t.model_copy(update={"complete": False, "revision": 0}), Record("s", 0, 0), now=0)
    assert not p.lanes["sft"].pending_entries()
    p.offer(t.model_copy(update={"revision": 1}), Record("s", 0, 1), now=0)
    p.offer(t.model_copy(update={"revision": 2, "success": False}), Record("s", 0, 2), now=0)
    assert not p.lanes["sft"].pending_entries()  # the latest revision is no longer a success
    assert p.commit_positions({("s", 0): 3})[("s", 0)] == 2  # still pending in the group lanes


def test_planner_applies_policy_lag_from_policy_updates_and_keeps_every_step():
    config = GRPOGroupConfig(retokenize=True, max_policy_lag=1)
    groups = GroupConfig(group_size=2)
    p = Planner(PlannerConfig(kinds=("grpo",), batch_trajectories=2, grpo=config, groups=groups))
    p.policy_updated(policy_update("v5", step=5))
    p.policy_updated(policy_update("v4", step=4))  # published late: an older version stays older
    group = golden_group()[:2]
    stale = [t.model_copy(update={"policy_version": "v3"}) for t in group]
    for i, t in enumerate(stale):
        p.offer(t, Record("s", 0, i), now=0)
    assert p.lanes["grpo"].pending_entries() == []  # lag 2 > 1: not admitted
    for i, t in enumerate(group):
        p.offer(t.model_copy(update={"policy_version": "v4"}), Record("s", 0, 10 + i), now=0)
    [batch] = p.due(now=0)
    assert batch.extra["training_step"] == 5 and batch.extra["current_policy"] == "v5"
    t1 = next(r for r in batch.rows if r["trajectory_id"] == "task-a-t1")
    assistant_turns = [m for m in t1["completion"] if m["role"] == "assistant"]
    assert len(assistant_turns) == len(group[0].steps) == 3  # no cut after the fact

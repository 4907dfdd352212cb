"""GRPO token rows: built from the token ids the policy server recorded, never re-tokenised."""

from consumers.batching.batch_writer import BatchManifest
from consumers.batching.builders.grpo import GRPOGroupBuilder, GRPOGroupConfig
from consumers.batching.planner import Entry, PlannedBatch, source_ranges
from consumers.batching.token_rows import IGNORE, replay
from schemas.events import ScoredStep, TrajectoryScored
from schemas.records import Record


def _step(i, prompt, start, completion, continuity="ok", version="v2", **kw):
    return ScoredStep(
        step_index=i,
        tool="calc",
        observation=f"obs {i}",
        prompt_token_ids=prompt,
        prompt_delta_start=start,
        token_ids=completion,
        logprobs=[-0.1 * (n + 1) for n in range(len(completion))] if completion is not None else None,
        token_continuity=continuity,
        policy_version=version,
        event_id=f"ev-{i}",
        **kw,
    )


def _traj(tid, steps, success=True, version="v3"):
    return TrajectoryScored(
        event_id=f"e-{tid}",
        trajectory_id=tid,
        occurred_at="2026-01-01T00:00:00Z",
        producer="p",
        task_id="k",
        group_id="g",
        success=success,
        policy_version=version,
        steps=steps,
    )


def _continuous():
    # turn 0: prompt [1, 2] -> [3, 4]; turn 1: context [1, 2, 3, 4] + observation [7] -> [8]
    return [_step(0, [1, 2], 0, [3, 4], "first"), _step(1, [7], 4, [8], "ok", version="base")]


def test_replay_rebuilds_the_final_context_with_masks_and_step_positions():
    seq = replay(_continuous())
    assert seq.input_ids == [1, 2, 3, 4, 7, 8]
    assert seq.labels == [IGNORE, IGNORE, 3, 4, IGNORE, 8]
    assert seq.step_ids == [-1, -1, 0, 0, 1, 1]
    assert seq.behaviour_logprobs == [None, None, -0.1, -0.2, None, -0.1]


def test_token_row_contract_and_group_fields():
    group = [_traj("a", _continuous()), _traj("b", _continuous(), success=False)]
    rows = GRPOGroupBuilder().build(group)
    assert [r["trajectory_id"] for r in rows] == ["a", "b"]
    row = rows[0]
    assert "prompt" not in row and "completion" not in row  # nothing re-tokenised
    assert row["input_ids"] == [1, 2, 3, 4, 7, 8] and row["labels"][2:4] == [3, 4]
    assert len(row["behaviour_logprobs"]) == len(row["input_ids"]) == len(row["step_ids"])
    assert row["behaviour_version"] == "base"  # step 1 was sampled by "base"
    assert row["step_event_ids"] == ["ev-0", "ev-1"]
    assert row["advantage"] > 0 > rows[1]["advantage"]
    assert (row["group_id"], row["group_size"], row["group_complete"]) == ("g", 2, True)
    assert (row["task_id"], row["reward"], row["policy_version"]) == ("k", 1.0, "v3")


def test_a_broken_step_replaces_the_context_and_is_not_trained():
    steps = [
        _step(0, [1, 2], 0, [3, 4], "first"),
        _step(1, [9, 7], 2, [8], "broken"),  # re-rendered from position 2: [3, 4] are gone
        _step(2, [6], 5, [5], "ok"),
    ]
    seq = replay(steps)
    assert seq.input_ids == [1, 2, 9, 7, 8, 6, 5]
    assert seq.labels == [IGNORE] * 6 + [5]
    assert seq.step_ids == [-1, -1, 1, 1, 1, 2, 2]
    assert seq.behaviour_logprobs[4] is None  # the broken step's completion


def test_every_step_broken_gives_no_row():
    steps = [_step(0, [1], 0, [2], "broken")]
    assert GRPOGroupBuilder().build([_traj("a", steps), _traj("b", steps, success=False)]) == []


def test_trajectories_without_token_ids_are_left_to_sft_unless_retokenize():
    plain = [ScoredStep(step_index=0, tool="calc", thought="t", observation="o")]
    group = [_traj("a", plain), _traj("b", plain, success=False)]
    builder = GRPOGroupBuilder()
    assert not builder.eligible(group[0]) and builder.build(group) == []
    retok = GRPOGroupBuilder(GRPOGroupConfig(retokenize=True))
    assert retok.eligible(group[0])
    rows = retok.build(group)
    assert len(rows) == 2 and rows[0]["completion"] and "input_ids" not in rows[0]
    # a recorded trajectory still gets its token row with retokenize on
    assert "input_ids" in retok.build([_traj("c", _continuous())])[0]


def test_a_delta_past_the_context_does_not_replay():
    assert replay([_step(0, [1], 0, [2], "first"), _step(1, [3], 9, [4])]) is None


def test_batches_carry_source_ranges_in_the_manifest_and_event():
    entries = [
        Entry(_traj(t, _continuous()), Record("trajectory.scored", p, o), f"h{o}")
        for t, p, o in [("a", 0, 7), ("b", 0, 3), ("c", 1, 5)]
    ]
    assert source_ranges(entries) == {"trajectory.scored": {"0": [3, 7], "1": [5, 5]}}
    meta = PlannedBatch("grpo", [], entries, {}).meta()
    manifest = BatchManifest(
        batch_id="b", kind="grpo", path="/x", format="jsonl", row_count=0, sha256="s",
        created_at="2026-01-01T00:00:00+00:00", sequence=0, **meta,
    )  # fmt: skip
    assert manifest.event().source_ranges == {"trajectory.scored": {"0": [3, 7], "1": [5, 5]}}
    assert manifest.event().source_offsets == {"trajectory.scored": {"0": 8, "1": 6}}


def test_the_builders_token_rows_go_through_the_executors_staleness_check():
    from consumers.training.offpolicy import admit_groups

    rows = GRPOGroupBuilder().build([_traj("a", _continuous()), _traj("b", _continuous(), success=False)])
    assert admit_groups(rows, "v2", 2).trained_groups == 1  # sampled by base: 2 behind, admitted whole
    assert admit_groups(rows, "v3", 2).dropped_groups == 1


def test_behaviour_version_is_the_oldest_in_schemas_order_and_unknown_ranks_oldest():
    from consumers.batching.builders.grpo import behaviour_version

    def sampled_by(*versions, trajectory="v9"):
        steps = [_step(i, [1], 0, [2], version=v) for i, v in enumerate(versions)]
        return behaviour_version(_traj("t", steps, version=trajectory))

    assert sampled_by("v10", "v9") == "v9"  # by number, not by text ("v10" < "v9" as strings)
    assert sampled_by("v3", None, trajectory=None) == "base"  # a step without a version: base
    assert sampled_by("v3", None) == "v3"  # ... unless the trajectory names one
    assert sampled_by("v3", "nightly", "base") == "nightly"  # no number: below every numbered one

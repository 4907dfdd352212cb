"""Pure event -> row mapping: every event type maps to its table with every column, values intact."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest

from consumers.sink.rows import COLUMNS, TYPED, rows_for
from schemas.codec import encode
from schemas.events import (
    BatchBuilt,
    DeadLetter,
    EpisodeEnded,
    EpisodeStarted,
    FeedbackAnnotation,
    JudgeFailed,
    JudgeStep,
    JudgeTrajectory,
    PolicyUpdated,
    RuleRewardStep,
    ScoredStep,
    StepRecorded,
    TrajectoryScored,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ENV = {"trajectory_id": "traj-1", "occurred_at": T0, "producer": "test"}

SAMPLES = [
    EpisodeStarted(
        event_id="a", task_id="task", domain="code", agent="ag", model="m", metadata={"k": 1}, **ENV
    ),
    StepRecorded(
        event_id="b",
        step_index=3,
        tool="bash",
        params={"cmd": "ls"},
        observation="out",
        exit_code=2,
        token_ids=[1, 2, 3],
        latency_ms=12.5,
        **ENV,
    ),
    EpisodeEnded(event_id="c", success=False, score=0.25, total_steps=4, **ENV),
    RuleRewardStep(
        event_id="d",
        step_index=3,
        redundancy=1.0,
        regression=None,
        score=0.5,
        reward_version="r1",
        source_event_id="b",
        **ENV,
    ),
    JudgeStep(
        event_id="e",
        step_index=3,
        scores={"goal": 0.5},
        score=0.5,
        judge_model="j",
        prompt_version="p1",
        cost_usd=0.01,
        **ENV,
    ),
    JudgeTrajectory(
        event_id="f", scores={"overall": 0.9}, score=0.9, judge_model="j", prompt_version="p1", **ENV
    ),
    JudgeFailed(event_id="g", reason="timeout", step_index=1, attempts=3, **ENV),
    FeedbackAnnotation(event_id="h", step_index=None, score=0.75, annotator="ann", **ENV),
    TrajectoryScored(
        event_id="i",
        task_id="task",
        revision=2,
        total_reward=0.6,
        success=True,
        steps=[ScoredStep(step_index=0, process_score=0.4), ScoredStep(step_index=1)],
        **ENV,
    ),
    BatchBuilt(
        event_id="j",
        batch_id="b1",
        kind="sft",
        path="/x",
        row_count=2,
        trajectory_ids=["traj-1"],
        source_offsets={"trajectory.scored": {"0": 5}},
        **ENV,
    ),
    PolicyUpdated(event_id="k", policy_version="v2", previous_version="v1", metrics={"loss": 0.5}, **ENV),
    DeadLetter(
        event_id="l",
        reason="bad",
        stage="rules",
        source_topic="agent.events",
        source_partition=1,
        source_offset=9,
        payload="{}",
        **ENV,
    ),
]


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.type)
def test_every_event_gives_an_events_row_and_a_full_typed_row(event):
    raw = encode(event)
    rows = rows_for(event, raw, "some.topic", 2, 41)
    table, row = rows[0]
    assert table == "events"
    as_dict = dict(zip(COLUMNS["events"], row, strict=True))
    assert as_dict["event_id"] == event.event_id and as_dict["type"] == event.type
    assert (as_dict["topic"], as_dict["partition"], as_dict["offset"]) == ("some.topic", 2, 41)
    assert orjson.loads(as_dict["raw"]) == orjson.loads(raw)
    typed_table, typed = rows[1]
    assert typed_table == TYPED[event.type][0]
    assert len(typed) == len(COLUMNS[typed_table])


def _typed(event) -> dict:
    table, row = rows_for(event, encode(event), "t", 0, 0)[1]
    return dict(zip(COLUMNS[table], row, strict=True))


def test_episode_halves_leave_the_other_half_absent():
    started, ended = _typed(SAMPLES[0]), _typed(SAMPLES[2])
    assert started["domain"] == "code" and started["success"] is None and started["ended_at"] is None
    assert ended["success"] == 0 and ended["score"] == 0.25 and ended["domain"] is None
    assert started["metadata"] == '{"k":1}'


def test_step_and_reward_values_are_kept_and_absent_layers_stay_none():
    step = _typed(SAMPLES[1])
    assert (step["step_index"], step["tool"], step["exit_code"], step["sampled_tokens"]) == (3, "bash", 2, 3)
    assert orjson.loads(step["params"]) == {"cmd": "ls"}
    rule = _typed(SAMPLES[3])
    assert rule["regression"] is None and rule["redundancy"] == 1.0 and rule["source_event_id"] == "b"


def test_judge_kinds_share_one_table():
    assert [_typed(e)["kind"] for e in SAMPLES[4:7]] == ["step", "trajectory", "failed"]
    failed = _typed(SAMPLES[6])
    assert failed["failure_reason"] == "timeout" and failed["attempts"] == 3 and failed["score"] is None


def test_trajectory_row_carries_revision_and_step_process_scores():
    row = _typed(SAMPLES[8])
    assert row["revision"] == 2 and row["total_reward"] == 0.6 and row["success"] == 1
    assert row["step_process_scores"] == [0.4, None]
    assert [s["step_index"] for s in orjson.loads(row["steps"])] == [0, 1]


def test_trajectory_row_carries_the_reward_layers_and_the_definition():
    judged = ScoredStep(step_index=0, rule_score=1.0, judge_score=0.5, layers=["rules", "judge"])
    failed = ScoredStep(
        step_index=1, rule_score=0.5, layers=["rules"], missing_layers={"judge": "failed (error): timeout"}
    )
    event = TrajectoryScored(
        event_id="t2", task_id="task", steps=[judged, failed], reward_version="assembly-1+rules-1",
        reward_definition="rules+judge(partial)@assembly-1+rules-1", **ENV,
    )  # fmt: skip
    row = _typed(event)
    assert row["reward_definition"] == "rules+judge(partial)@assembly-1+rules-1"
    assert row["step_layers"] == [["rules", "judge"], ["rules"]]
    assert row["step_missing_layers"] == [{}, {"judge": "failed (error): timeout"}]
    assert row["missing_layers"] == {"judge": 1}


def test_a_trajectory_from_before_1_2_gets_the_layers_its_scores_imply():
    old = TrajectoryScored(
        event_id="t1", task_id="task", schema_version="1.1", reward_version="assembly-1+rules-1",
        steps=[ScoredStep(step_index=0, rule_score=1.0), ScoredStep(step_index=1, rule_score=0.5)], **ENV,
    )  # fmt: skip
    row = _typed(old)
    assert row["reward_definition"] == "rules@assembly-1+rules-1"
    assert row["step_layers"] == [["rules"], ["rules"]] and row["missing_layers"] == {}


def test_unknown_event_types_still_land_in_events():
    class Later(EpisodeEnded):
        pass

    event = Later(event_id="z", success=True, **ENV).model_copy(update={"type": "something.new"})
    assert [t for t, _ in rows_for(event, b"{}", "t", 0, 0)] == ["events"]


def test_a_batchs_row_chunks_are_consumed_without_a_row_and_its_batch_built_still_lands():
    """`batch.rows` (since 1.5) carries a batch's rows to the executor: the store keeps no copy."""
    from schemas.events import BatchRows

    chunk = BatchRows(event_id="c0", batch_id="b1", kind="sft", index=0, chunks=1, rows_sha256="ab",
                      rows=[{"messages": []}], **ENV)  # fmt: skip
    assert rows_for(chunk, encode(chunk), "training.batches", 0, 3) == []
    built = BatchBuilt(event_id="b", batch_id="b1", kind="sft", path="/x", row_count=1, chunks=1, **ENV)
    assert [t for t, _ in rows_for(built, encode(built), "training.batches", 0, 4)] == ["events", "batches"]

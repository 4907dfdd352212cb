"""Pure event -> ClickHouse row mapping, one function per typed table. No I/O here.

`rows_for(event, raw, topic, partition, offset)` returns `[(table, row_tuple), ...]`: always one
`events` row (the raw JSON plus typed envelope and source coordinates), plus the typed row(s) for the
event's own table. Column order is `COLUMNS[table]`. Absent values stay None (never a neutral 0.5).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import orjson

from schemas.events import (
    BatchBuilt,
    DeadLetter,
    EpisodeEnded,
    EpisodeStarted,
    EventBase,
    FeedbackAnnotation,
    JudgeFailed,
    JudgeStep,
    JudgeTrajectory,
    PolicyUpdated,
    RuleRewardStep,
    StepRecorded,
    TrajectoryScored,
)

COLUMNS: dict[str, tuple[str, ...]] = {
    "events": (
        "event_id",
        "type",
        "schema_version",
        "trajectory_id",
        "occurred_at",
        "producer",
        "topic",
        "partition",
        "offset",
        "raw",
    ),
    "episodes": (
        "trajectory_id",
        "task_id",
        "task",
        "domain",
        "agent",
        "model",
        "policy_version",
        "group_id",
        "reference_steps",
        "metadata",
        "started_at",
        "ended_at",
        "success",
        "score",
        "tests_passed",
        "tests_failed",
        "terminated",
        "truncated",
        "total_steps",
        "error",
    ),
    "steps": (
        "event_id",
        "trajectory_id",
        "step_index",
        "occurred_at",
        "thought",
        "tool",
        "params",
        "observation",
        "exit_code",
        "error",
        "model",
        "policy_version",
        "input_tokens",
        "output_tokens",
        "latency_ms",
        "sampled_tokens",
        "producer",
    ),
    "rule_rewards": (
        "event_id",
        "trajectory_id",
        "step_index",
        "occurred_at",
        "redundancy",
        "regression",
        "info_utilization",
        "score",
        "domain",
        "reward_version",
        "source_event_id",
    ),
    "judge_scores": (
        "event_id",
        "trajectory_id",
        "kind",
        "step_index",
        "occurred_at",
        "scores",
        "score",
        "rationale",
        "judge_model",
        "prompt_version",
        "input_tokens",
        "output_tokens",
        "cost_usd",
        "latency_ms",
        "cached",
        "group_id",
        "mode",
        "source_event_id",
        "failure_reason",
        "failure_kind",
        "attempts",
    ),
    "annotations": (
        "event_id",
        "trajectory_id",
        "step_index",
        "occurred_at",
        "rubric",
        "score",
        "annotator",
        "comment",
        "producer",
    ),
    "trajectories": (
        "trajectory_id",
        "revision",
        "event_id",
        "occurred_at",
        "task_id",
        "task",
        "domain",
        "agent",
        "model",
        "policy_version",
        "group_id",
        "success",
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
        "step_process_scores",
        "steps",
        "metadata",
    ),
    "batches": (
        "batch_id",
        "event_id",
        "occurred_at",
        "kind",
        "path",
        "format",
        "row_count",
        "trajectory_ids",
        "source_offsets",
        "reward_versions",
        "calibration_versions",
        "policy_versions",
        "builder_config",
        "sha256",
    ),
    "policy_updates": (
        "policy_version",
        "event_id",
        "occurred_at",
        "previous_version",
        "base_model",
        "checkpoint_path",
        "method",
        "step",
        "batch_ids",
        "metrics",
    ),
    "dead_letters": (
        "event_id",
        "trajectory_id",
        "occurred_at",
        "stage",
        "reason",
        "error_type",
        "source_topic",
        "source_partition",
        "source_offset",
        "source_key",
        "payload",
        "payload_encoding",
    ),
}

Row = tuple
TableRow = tuple[str, Row]


def _json(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _flag(value: bool | None) -> int | None:
    return None if value is None else int(value)


def event_row(event: EventBase, raw: bytes, topic: str, partition: int, offset: int) -> Row:
    """The `events` row: envelope, source coordinates and the raw JSON exactly as received."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes | bytearray) else str(raw)
    return (
        event.event_id,
        event.type,
        event.schema_version,
        event.trajectory_id,
        event.occurred_at,
        event.producer,
        topic,
        partition,
        offset,
        text,
    )


def episode_started_row(e: EpisodeStarted) -> Row:
    return (
        e.trajectory_id,
        e.task_id,
        e.task,
        e.domain,
        e.agent,
        e.model,
        e.policy_version,
        e.group_id,
        e.reference_steps,
        _json(e.metadata),
        e.occurred_at,
        *([None] * 9),
    )


def episode_ended_row(e: EpisodeEnded) -> Row:
    return (
        e.trajectory_id,
        *([None] * 10),
        e.occurred_at,
        _flag(e.success),
        e.score,
        e.tests_passed,
        e.tests_failed,
        _flag(e.terminated),
        _flag(e.truncated),
        e.total_steps,
        e.error,
    )


def step_row(e: StepRecorded) -> Row:
    return (
        e.event_id,
        e.trajectory_id,
        e.step_index,
        e.occurred_at,
        e.thought,
        e.tool,
        _json(e.params),
        e.observation,
        e.exit_code,
        e.error,
        e.model,
        e.policy_version,
        e.input_tokens,
        e.output_tokens,
        e.latency_ms,
        len(e.token_ids or ()),
        e.producer,
    )


def rule_reward_row(e: RuleRewardStep) -> Row:
    return (
        e.event_id,
        e.trajectory_id,
        e.step_index,
        e.occurred_at,
        e.redundancy,
        e.regression,
        e.info_utilization,
        e.score,
        e.domain,
        e.reward_version,
        e.source_event_id,
    )


def _judge_row(e: EventBase, kind: str, **values) -> Row:
    base = {
        "event_id": e.event_id,
        "trajectory_id": e.trajectory_id,
        "kind": kind,
        "step_index": None,
        "occurred_at": e.occurred_at,
        "scores": {},
        "score": None,
        "rationale": "",
        "judge_model": "",
        "prompt_version": "",
        "input_tokens": 0,
        "output_tokens": 0,
        "cost_usd": 0.0,
        "latency_ms": 0.0,
        "cached": 0,
        "group_id": None,
        "mode": "",
        "source_event_id": None,
        "failure_reason": "",
        "failure_kind": "",
        "attempts": 0,
    }
    base.update(values)
    return tuple(base[c] for c in COLUMNS["judge_scores"])


def _judge_cost(e: JudgeStep | JudgeTrajectory) -> dict:
    return {
        "scores": dict(e.scores),
        "score": e.score,
        "rationale": e.rationale,
        "judge_model": e.judge_model,
        "prompt_version": e.prompt_version,
        "input_tokens": e.input_tokens,
        "output_tokens": e.output_tokens,
        "cost_usd": e.cost_usd,
        "latency_ms": e.latency_ms,
        "cached": int(e.cached),
    }


def judge_step_row(e: JudgeStep) -> Row:
    return _judge_row(e, "step", step_index=e.step_index, source_event_id=e.source_event_id, **_judge_cost(e))


def judge_trajectory_row(e: JudgeTrajectory) -> Row:
    return _judge_row(e, "trajectory", group_id=e.group_id, mode=e.mode, **_judge_cost(e))


def judge_failed_row(e: JudgeFailed) -> Row:
    return _judge_row(
        e,
        "failed",
        step_index=e.step_index,
        judge_model=e.judge_model,
        prompt_version=e.prompt_version,
        failure_reason=e.reason,
        failure_kind=e.kind,
        attempts=e.attempts,
    )


def annotation_row(e: FeedbackAnnotation) -> Row:
    return (
        e.event_id,
        e.trajectory_id,
        e.step_index,
        e.occurred_at,
        e.rubric,
        e.score,
        e.annotator,
        e.comment,
        e.producer,
    )


def trajectory_row(e: TrajectoryScored) -> Row:
    return (
        e.trajectory_id,
        e.revision,
        e.event_id,
        e.occurred_at,
        e.task_id,
        e.task,
        e.domain,
        e.agent,
        e.model,
        e.policy_version,
        e.group_id,
        _flag(e.success),
        e.total_steps,
        e.outcome_score,
        e.process_score,
        e.efficiency_score,
        e.total_reward,
        int(e.complete),
        list(e.missing),
        e.reward_version,
        e.calibration_version,
        e.started_at,
        e.ended_at,
        [s.process_score for s in e.steps],
        _json([s.model_dump(mode="json", exclude={"token_ids", "logprobs"}) for s in e.steps]),
        _json(e.metadata),
    )


def batch_row(e: BatchBuilt) -> Row:
    return (
        e.batch_id,
        e.event_id,
        e.occurred_at,
        e.kind,
        e.path,
        e.format,
        e.row_count,
        list(e.trajectory_ids),
        _json(e.source_offsets),
        list(e.reward_versions),
        list(e.calibration_versions),
        list(e.policy_versions),
        _json(e.builder_config),
        e.sha256,
    )


def policy_row(e: PolicyUpdated) -> Row:
    return (
        e.policy_version,
        e.event_id,
        e.occurred_at,
        e.previous_version,
        e.base_model,
        e.checkpoint_path,
        e.method,
        e.step,
        list(e.batch_ids),
        dict(e.metrics),
    )


def dead_letter_row(e: DeadLetter) -> Row:
    return (
        e.event_id,
        e.trajectory_id,
        e.occurred_at,
        e.stage,
        e.reason,
        e.error_type,
        e.source_topic,
        e.source_partition,
        e.source_offset,
        e.source_key,
        e.payload,
        e.payload_encoding,
    )


# event type -> (table, row builder)
TYPED: dict[str, tuple[str, Callable[[EventBase], Row]]] = {
    "episode.started": ("episodes", episode_started_row),
    "episode.ended": ("episodes", episode_ended_row),
    "step.recorded": ("steps", step_row),
    "reward.rule.step": ("rule_rewards", rule_reward_row),
    "reward.judge.step": ("judge_scores", judge_step_row),
    "reward.judge.trajectory": ("judge_scores", judge_trajectory_row),
    "reward.judge.failed": ("judge_scores", judge_failed_row),
    "feedback.annotation": ("annotations", annotation_row),
    "trajectory.scored": ("trajectories", trajectory_row),
    "batch.built": ("batches", batch_row),
    "policy.updated": ("policy_updates", policy_row),
    "dead.letter": ("dead_letters", dead_letter_row),
}


def rows_for(event: EventBase, raw: bytes, topic: str, partition: int, offset: int) -> list[TableRow]:
    """Every row one event produces: its `events` row and its typed row.

    >>> from datetime import UTC, datetime
    >>> from schemas.events import EpisodeEnded
    >>> e = EpisodeEnded(event_id="e1", trajectory_id="t1", occurred_at=datetime(2026, 1, 1, tzinfo=UTC),
    ...                  producer="sdk", success=True, score=0.75)
    >>> [(table, row[0]) for table, row in rows_for(e, b"{}", "agent.events", 0, 7)]
    [('events', 'e1'), ('episodes', 't1')]
    """
    rows: list[TableRow] = [("events", event_row(event, raw, topic, partition, offset))]
    typed = TYPED.get(event.type)
    if typed is not None:
        table, build = typed
        rows.append((table, build(event)))
    return rows


def as_utc(value: datetime | None) -> datetime | None:
    """Helper for tests/readers: ClickHouse returns naive UTC datetimes for DateTime64('UTC')."""
    from datetime import UTC

    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)

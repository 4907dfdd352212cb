"""Pure event -> ClickHouse row mapping, one function per typed table. No I/O here.

`rows_for(event, raw, topic, partition, offset)` returns `[(table, row_tuple), ...]`: always one
`events` row (the raw JSON plus typed envelope and source coordinates), plus the typed row(s) for the
event's own table; none at all for the types in `SKIPPED`. Column order is `COLUMNS[table]`.
Absent values stay None (never a neutral 0.5).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from functools import cache

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
    RewardVersionCompleted,
    RuleRewardStep,
    StepRecorded,
    TrajectoryScored,
)


def _columns(names: str) -> tuple[str, ...]:
    return tuple(names.split())


COLUMNS: dict[str, tuple[str, ...]] = {
    "events": _columns(
        "event_id type schema_version trajectory_id occurred_at producer topic partition offset raw"
    ),
    "episodes": _columns(
        "trajectory_id task_id task domain agent model policy_version group_id reference_steps "
        "metadata started_at ended_at success score tests_passed tests_failed terminated truncated "
        "total_steps error purpose"
    ),
    "steps": _columns(
        "event_id trajectory_id step_index occurred_at thought tool params observation exit_code error "
        "model policy_version input_tokens output_tokens latency_ms sampled_tokens producer "
        "token_continuity token_continuity_break token_rl_eligible tokenizer_hash finish_reason redactions"
    ),
    "rule_rewards": _columns(
        "event_id trajectory_id step_index occurred_at redundancy regression info_utilization score "
        "domain reward_version source_event_id"
    ),
    "judge_scores": _columns(
        "event_id trajectory_id kind step_index occurred_at scores score rationale judge_model "
        "prompt_version input_tokens output_tokens cost_usd latency_ms cached group_id mode "
        "source_event_id failure_reason failure_kind attempts"
    ),
    "annotations": _columns(
        "event_id trajectory_id step_index occurred_at rubric score annotator comment producer"
    ),
    "trajectories": _columns(
        "trajectory_id revision event_id occurred_at task_id task domain agent model policy_version "
        "group_id success total_steps outcome_score process_score efficiency_score total_reward "
        "complete missing reward_version calibration_version started_at ended_at "
        "step_process_scores steps metadata reward_definition step_layers step_missing_layers "
        "missing_layers purpose"
    ),
    "batches": _columns(
        "batch_id event_id occurred_at kind path format row_count trajectory_ids source_offsets "
        "reward_versions calibration_versions policy_versions builder_config sha256"
    ),
    "policy_updates": _columns(
        "policy_version event_id occurred_at previous_version base_model checkpoint_path method step "
        "batch_ids metrics"
    ),
    "policy_versions": _columns(
        "policy_version previous_version event_id occurred_at method step base_model checkpoint_path "
        "batch_ids trajectory_ids behaviour_versions source_ranges staleness_histogram dropped_groups "
        "metrics loss is_ratio_mean is_ratio_max ess clipped_fraction kl base_model_id tokenizer_hash "
        "gate gate_figures rows_over_max_length"
    ),
    "trajectory_versions_seen": _columns("reward_version"),
    "reward_versions": _columns(
        "version event_id occurred_at roles source_end_offsets since started_at completed_at app_id producer"
    ),
    "dead_letters": _columns(
        "event_id trajectory_id occurred_at stage reason error_type source_topic source_partition "
        "source_offset source_key payload payload_encoding payload_bytes payload_sha256 payload_truncated"
    ),
}

Row = tuple
TableRow = tuple[str, Row]

# The columns of `episodes` each half of an episode fills (the other half's are None; the table
# merges the two rows per trajectory).
_STARTED = frozenset((*COLUMNS["episodes"][:11], "purpose"))
_ENDED = frozenset(("trajectory_id", *COLUMNS["episodes"][11:20]))


def _json(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _flag(value: bool | None) -> int | None:
    return None if value is None else int(value)


def _row(table: str, e: EventBase, only: frozenset[str] | None = None, **computed: object) -> Row:
    """The row of `table` for `e`: per column, `computed[column]`, else the event's attribute of the
    same name (None for columns outside `only`, when given)."""
    return _row_builder(table, tuple(computed), only)(e, computed)


@cache
def _row_builder(table: str, computed: tuple[str, ...], only: frozenset[str] | None) -> Callable:
    """`(event, computed) -> row` for one table and one set of computed columns, compiled once into a
    single tuple display (`(e.event_id, e.type, k['topic'], ...)`): the sink builds several rows per
    step, and a loop over the columns with a lookup each was a quarter of its Python time. The source
    is made only from the column names in `COLUMNS`, which are identifiers."""
    values = []
    for column in COLUMNS[table]:
        assert column.isidentifier(), column
        if column in computed:
            values.append(f"k[{column!r}]")
        elif only is None or column in only:
            values.append(f"e.{column}")
        else:
            values.append("None")
    return eval(f"lambda e, k: ({', '.join(values)},)")  # built from COLUMNS only


def event_row(event: EventBase, raw: bytes, topic: str, partition: int, offset: int) -> Row:
    """The `events` row: envelope, source coordinates and the raw JSON exactly as received (as bytes:
    it decoded, so it is UTF-8, and ClickHouse takes the bytes without a decode and encode)."""
    data = bytes(raw) if isinstance(raw, bytes | bytearray | memoryview) else str(raw).encode()
    return _row("events", event, topic=topic, partition=partition, offset=offset, raw=data)


def episode_started_row(e: EpisodeStarted) -> Row:
    return _row("episodes", e, _STARTED, metadata=_json(e.metadata), started_at=e.occurred_at)


def episode_ended_row(e: EpisodeEnded) -> Row:
    return _row(
        "episodes", e, _ENDED, ended_at=e.occurred_at, success=_flag(e.success),
        terminated=_flag(e.terminated), truncated=_flag(e.truncated),
    )  # fmt: skip


def step_row(e: StepRecorded) -> Row:
    return _row(
        "steps", e, params=_json(e.params), sampled_tokens=len(e.token_ids or ()),
        token_rl_eligible=_flag(e.token_rl_eligible),
    )  # fmt: skip


def rule_reward_row(e: RuleRewardStep) -> Row:
    return _row("rule_rewards", e)


_JUDGE_DEFAULTS: dict[str, object] = {
    "step_index": None, "scores": {}, "score": None, "rationale": "", "judge_model": "",
    "prompt_version": "", "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0, "latency_ms": 0.0,
    "cached": 0, "group_id": None, "mode": "", "source_event_id": None, "failure_reason": "",
    "failure_kind": "", "attempts": 0,
}  # fmt: skip


def _judge_row(e: EventBase, kind: str, **values) -> Row:
    """One row shape for judge scores and failures: what an event lacks takes its default."""
    return _row("judge_scores", e, **{**_JUDGE_DEFAULTS, **values, "kind": kind})


def _judge_cost(e: JudgeStep | JudgeTrajectory) -> dict:
    names = ("score", "rationale", "judge_model", "prompt_version", "input_tokens", "output_tokens")
    return {n: getattr(e, n) for n in (*names, "cost_usd", "latency_ms")} | {
        "scores": dict(e.scores),
        "cached": int(e.cached),
    }


def judge_step_row(e: JudgeStep) -> Row:
    return _judge_row(e, "step", step_index=e.step_index, source_event_id=e.source_event_id, **_judge_cost(e))


def judge_trajectory_row(e: JudgeTrajectory) -> Row:
    return _judge_row(e, "trajectory", group_id=e.group_id, mode=e.mode, **_judge_cost(e))


def judge_failed_row(e: JudgeFailed) -> Row:
    return _judge_row(
        e, "failed", step_index=e.step_index, judge_model=e.judge_model, prompt_version=e.prompt_version,
        failure_reason=e.reason, failure_kind=e.kind, attempts=e.attempts,
    )  # fmt: skip


def annotation_row(e: FeedbackAnnotation) -> Row:
    return _row("annotations", e)


def _missing_layer_counts(e: TrajectoryScored) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in e.steps:
        for layer in s.missing_layers:
            counts[layer] = counts.get(layer, 0) + 1
    return counts


def trajectory_row(e: TrajectoryScored) -> Row:
    """Layers as of schema 1.2; an older event gets the layers and definition its scores imply
    (`present_layers`, `definition`) and no missing reasons (it did not state them)."""
    steps = [s.model_dump(mode="json", exclude={"token_ids", "logprobs"}) for s in e.steps]
    return _row(
        "trajectories", e, success=_flag(e.success), complete=int(e.complete), missing=list(e.missing),
        step_process_scores=[s.process_score for s in e.steps], steps=_json(steps),
        metadata=_json(e.metadata), reward_definition=e.definition(),
        step_layers=[s.present_layers() for s in e.steps],
        step_missing_layers=[dict(s.missing_layers) for s in e.steps],
        missing_layers=_missing_layer_counts(e),
    )  # fmt: skip


def version_seen_row(e: TrajectoryScored) -> Row:
    """The trajectory's reward version, seen now (the table keeps the first time: migration 0009)."""
    return (e.reward_version,)


def batch_row(e: BatchBuilt) -> Row:
    return _row(
        "batches", e, trajectory_ids=list(e.trajectory_ids), source_offsets=_json(e.source_offsets),
        reward_versions=list(e.reward_versions), calibration_versions=list(e.calibration_versions),
        policy_versions=list(e.policy_versions), builder_config=_json(e.builder_config),
    )  # fmt: skip


def policy_row(e: PolicyUpdated) -> Row:
    return _row("policy_updates", e, batch_ids=list(e.batch_ids), metrics=dict(e.metrics))


_HEADLINE_METRICS = ("loss", "is_ratio_mean", "is_ratio_max", "ess", "clipped_fraction", "kl")


def _count_metric(e: PolicyUpdated, name: str) -> int:
    """A count carried in `metrics` as a UInt32 column (0 when absent: none, or before 1.5).

    >>> _count_metric(PolicyUpdated(event_id="e", trajectory_id="v1", occurred_at="2026-01-01T00:00:00Z",
    ...     producer="p", policy_version="v1", metrics={"rows_over_max_length": 3.0}), "rows_over_max_length")
    3
    """
    value = e.metrics.get(name, 0.0)
    if not math.isfinite(value) or value != int(value) or not 0 <= value < 2**32:
        raise ValueError(f"policy.updated metrics.{name}: expected a count in [0, 2^32), got {value!r}")
    return int(value)


def policy_version_row(e: PolicyUpdated) -> Row:
    """One row per version: lineage as arrays / JSON, the headline metrics as columns (None when the
    method has no such metric, e.g. no importance ratio for SFT)."""
    return _row(
        "policy_versions", e, batch_ids=list(e.batch_ids), trajectory_ids=list(e.trajectory_ids),
        behaviour_versions=list(e.behaviour_versions), source_ranges=_json(e.source_ranges),
        staleness_histogram=dict(e.staleness_histogram), metrics=dict(e.metrics),
        gate_figures=dict(e.gate_figures),
        rows_over_max_length=_count_metric(e, "rows_over_max_length"),
        **{name: e.metrics.get(name) for name in _HEADLINE_METRICS},
    )  # fmt: skip


def dead_letter_row(e: DeadLetter) -> Row:
    return _row("dead_letters", e, payload_truncated=int(e.payload_truncated))


def reward_version_row(e: RewardVersionCompleted) -> Row:
    """The registry row of a completed replay (migration 0009; docs/reward-versions.md)."""
    return _row("reward_versions", e, roles=list(e.roles), source_end_offsets=_json(e.source_end_offsets))


# event type -> (table, row builder): the event's own table
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
    "reward.version.completed": ("reward_versions", reward_version_row),
}

# event type -> further (table, row builder)s: policy.updated also keeps its original table
ALSO: dict[str, tuple[tuple[str, Callable[[EventBase], Row]], ...]] = {
    "policy.updated": (("policy_versions", policy_version_row),),
    "trajectory.scored": (("trajectory_versions_seen", version_seen_row),),
}


# Event types the store keeps no row of, on purpose (consumed and committed like any other): a
# batch's rows (`batch.rows`, since 1.5) travel to the executor; `batches` keeps their batch.built
# (row count and checksum) and the trainer's batch file the rows, so a copy of every row in `events`
# would only double the store.
SKIPPED = frozenset({"batch.rows"})


def rows_for(event: EventBase, raw: bytes, topic: str, partition: int, offset: int) -> list[TableRow]:
    """Every row one event produces: its `events` row, its typed row and any `ALSO` rows (none for a
    type in `SKIPPED`).

    >>> from datetime import UTC, datetime
    >>> from schemas.events import EpisodeEnded
    >>> e = EpisodeEnded(event_id="e1", trajectory_id="t1", occurred_at=datetime(2026, 1, 1, tzinfo=UTC),
    ...                  producer="sdk", success=True, score=0.75)
    >>> [(table, row[0]) for table, row in rows_for(e, b"{}", "agent.events", 0, 7)]
    [('events', 'e1'), ('episodes', 't1')]
    """
    if event.type in SKIPPED:
        return []
    rows: list[TableRow] = [("events", event_row(event, raw, topic, partition, offset))]
    typed = TYPED.get(event.type)
    if typed is not None:
        table, build = typed
        rows.append((table, build(event)))
    rows += [(table, build(event)) for table, build in ALSO.get(event.type, ())]
    return rows


def as_utc(value: datetime | None) -> datetime | None:
    """Helper for tests/readers: ClickHouse returns naive UTC datetimes for DateTime64('UTC')."""
    from datetime import UTC

    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)

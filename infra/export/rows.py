"""Scored trajectories -> dataset rows, through the trainer's own builders (never a second copy).

What the trainer does before it builds a batch, done here the same way: only the latest revision
of a trajectory counts, content duplicates (same task and steps) are skipped, and trajectories are
grouped by task (DPO) or by task and group (GRPO) before their builder sees them, each group kept to
the reward definition most of its members share (`split_by_definition`, docs/reward-definitions.md:
a pair or a group never compares rewards of different definitions). GRPO rows are the
builder's message rows (`retokenize`: `prompt`, `completion`, `advantage`, `reward`, ...), since
ClickHouse keeps no token ids; TRL's GRPOTrainer reads `prompt` and hands the other columns to its
reward functions. Pure; no I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from consumers.batching.builders.common import reward_of
from consumers.batching.builders.dedup import Deduplicator
from consumers.batching.builders.dpo import DPOPairBuilder, DPOPairConfig, StepPairBuilder
from consumers.batching.builders.groups import GroupConfig
from consumers.batching.builders.grpo import GRPOGroupBuilder, GRPOGroupConfig
from consumers.batching.builders.sft import SFTBuilder, SFTBuilderConfig
from consumers.batching.planner import split_by_definition
from infra.export.config import ExportConfig
from schemas.events import TrajectoryScored

Row = dict[str, Any]


def latest_unique(trajectories: Iterable[TrajectoryScored]) -> list[TrajectoryScored]:
    """The latest revision of each trajectory, content duplicates dropped, in trajectory id order."""
    latest: dict[str, TrajectoryScored] = {}
    for t in trajectories:
        held = latest.get(t.trajectory_id)
        if held is None or t.revision >= held.revision:
            latest[t.trajectory_id] = t
    seen = Deduplicator()
    return [t for _, t in sorted(latest.items()) if not seen.seen_before(t)]


def builder_settings(config: ExportConfig) -> dict[str, Any]:
    """The builder configuration of this export (recorded in the card)."""
    if config.kind == "sft":
        return sft_config(config).to_dict()
    if config.kind == "grpo":
        return grpo_config().to_dict() | GroupConfig().to_dict()
    return DPOPairConfig().to_dict()


def sft_config(config: ExportConfig) -> SFTBuilderConfig:
    return SFTBuilderConfig(require_success=config.require_success, min_reward=config.min_reward)


def grpo_config() -> GRPOGroupConfig:
    return GRPOGroupConfig(retokenize=True)


def build_rows(config: ExportConfig, trajectories: Iterable[TrajectoryScored]) -> list[Row]:
    """The rows of `config.kind` from the latest, distinct revisions of `trajectories`."""
    chosen = latest_unique(trajectories)
    if config.kind == "sft":
        return SFTBuilder(sft_config(config)).build(chosen)
    if config.kind == "grpo":
        return _grpo_rows(chosen)
    pairs = DPOPairBuilder() if config.kind == "dpo" else StepPairBuilder()
    rated = [t for t in chosen if t.steps and reward_of(t) is not None]
    return [row for group in _grouped(rated, lambda t: (t.task_id,)) for row in pairs.build(group)]


def _grpo_rows(trajectories: list[TrajectoryScored]) -> list[Row]:
    builder, smallest = GRPOGroupBuilder(grpo_config()), GroupConfig().min_group_size
    admitted = [t for t in trajectories if builder.eligible(t)]
    groups = _grouped(admitted, lambda t: (t.task_id, t.group_id or ""))
    return [row for group in groups if len(group) >= smallest for row in builder.build(group)]


def _grouped(trajectories: list[TrajectoryScored], key) -> list[list[TrajectoryScored]]:
    """Groups by `key`, in key order, each cut to its most common reward definition."""
    groups: dict[tuple[str, ...], list[TrajectoryScored]] = defaultdict(list)
    for t in trajectories:
        groups[key(t)].append(t)
    return [one_definition(groups[k]) for k in sorted(groups)]


def one_definition(group: list[TrajectoryScored]) -> list[TrajectoryScored]:
    """The members sharing the definition most of them have (ties: more layers, then the smaller id).

    >>> from schemas.events import ScoredStep
    >>> def t(i, layers):
    ...     return TrajectoryScored(event_id=i, trajectory_id=i, occurred_at="2026-01-01T00:00:00Z",
    ...         producer="p", task_id="k", reward_version="v",
    ...         steps=[ScoredStep(step_index=0, layers=layers)], reward_definition="")
    >>> [m.trajectory_id for m in one_definition([t("a", ["rules", "judge"]), t("b", ["rules"]),
    ...                                           t("c", ["rules", "judge"])])]
    ['a', 'c']
    """
    _, kept, _ = split_by_definition([t.definition() for t in group])
    return [group[i] for i in kept]


def row_trajectory_ids(row: Row) -> list[str]:
    """The trajectories a row was built from (one, or a DPO pair's two).

    >>> row_trajectory_ids({"chosen_trajectory_id": "a", "rejected_trajectory_id": "b"})
    ['a', 'b']
    """
    keys = ("trajectory_id", "chosen_trajectory_id", "rejected_trajectory_id")
    return [row[k] for k in keys if row.get(k)]


def drop_empty_columns(rows: list[Row]) -> list[Row]:
    """Rows without the columns that hold no value in any row (None, or lists of None only, such
    as `step_event_ids` of steps recorded without ids): Arrow cannot type them, and `datasets`' JSON
    loader fails on a list of nulls.

    >>> drop_empty_columns([{"a": 1, "b": None, "c": [None]}, {"a": 2, "b": None, "c": []}])
    [{'a': 1}, {'a': 2}]
    """
    keys = list(dict.fromkeys(k for r in rows for k in r))
    empty = {k for k in keys if all(_no_value(r.get(k)) for r in rows)}
    return [{k: v for k, v in r.items() if k not in empty} for r in rows] if empty else rows


def _no_value(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(v is None for v in value))

"""The batch kinds, in one place: name -> builder, the training method for its rows, a description.

Everything that names batch kinds reads `KINDS`: the `--kinds` option (help, default, validation),
the planner's lanes, the batch store's directories and recovery scan, and `agentstream train`
(the method per kind, `--follow`'s default kind per method).

Grouped kinds (DPO pairs, GRPO advantages) compare rewards within a group, so the planner builds a
group from trajectories of one reward definition only (planner.py, `split_by_definition`).

Adding a batch kind: write its pure builder under `builders/` (config + `build`), then add one
`BatchKind` entry here. A kind whose builder has its own options nests that config in
`config.PlannerConfig` (its fields become `agentstream batch` options).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from consumers.batching.builders.common import reward_of
from consumers.batching.builders.dpo import DPOPairBuilder, StepPairBuilder
from consumers.batching.builders.grpo import GRPOGroupBuilder
from consumers.batching.builders.sft import SFTBuilder
from schemas.events import TrajectoryScored

# `config.PlannerConfig` (which reads this registry for its `--kinds` option), typed
# here as an alias of Any so the two modules do not import each other.
PlannerConfig = Any

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class BatchContext:
    """What a builder may need beyond its trajectories (the planner passes it in; pure values)."""

    complete: bool = True  # the group reached its full size (grouped kinds)
    training_step: int = 0  # of the newest policy (recorded in GRPO manifests)
    current_policy: str | None = None  # newest policy version (GRPO staleness)


@dataclass(frozen=True)
class Resources:
    """What builders are made with beyond their options (the batch builder provides them at start)."""

    tokenizer: Any = None  # sft_tokenized renders and tokenizes with it
    base_tokenizer_hash: Callable[[], str] | None = None  # GRPO: the training base's (None: not checked)


def _no_report(_builder: Any) -> dict[str, int]:
    return {}


@dataclass(frozen=True)
class BatchKind:
    """One kind of training batch.

    `make(config, resources)` builds its builder once per planner; `eligible(builder, trajectory,
    context)` admits a trajectory; `rows(builder, trajectories, context)` builds a batch (grouped
    kinds get one task group at a time); `settings(config)` is the manifest's `builder_config`, to
    which `report(builder)` adds the builder's counts since the previous batch.
    """

    name: str
    method: str  # the loss `agentstream train` uses on these rows: sft, dpo or grpo
    description: str
    make: Callable[[PlannerConfig, Resources], Any]
    settings: Callable[[PlannerConfig], dict[str, Any]]
    eligible: Callable[[Any, TrajectoryScored, BatchContext], bool]
    rows: Callable[[Any, list[TrajectoryScored], BatchContext], Rows]
    report: Callable[[Any], dict[str, int]] = _no_report
    grouped: bool = False  # gather groups of one task first (pairs and advantages need siblings)
    group_key: Callable[[TrajectoryScored], tuple[str, ...]] = lambda t: (t.task_id,)
    needs_tokenizer: bool = False
    follow_default: bool = False  # the kind `train --follow --method <method>` trains on by default


def _tokenized(config: PlannerConfig, resources: Resources):
    from consumers.batching.tokenize import SFTTokenizedBuilder

    return SFTTokenizedBuilder(resources.tokenizer, config.sft)


def _has_reward(_builder: Any, t: TrajectoryScored, _context: BatchContext) -> bool:
    return bool(t.steps) and reward_of(t) is not None


def _build(builder: Any, trajectories: list[TrajectoryScored], _context: BatchContext) -> Rows:
    return builder.build(trajectories)


def _sft_settings(config: PlannerConfig) -> dict[str, Any]:
    return config.sft.to_dict()


def _group_settings(config: PlannerConfig) -> dict[str, Any]:
    """How groups are formed: shared by DPO and GRPO (the definition rule: planner.py)."""
    return config.groups.to_dict() | {"group_definition_wait_s": config.group_definition_wait_s}


def _dpo_settings(config: PlannerConfig) -> dict[str, Any]:
    return config.dpo.to_dict() | _group_settings(config)


KINDS: dict[str, BatchKind] = {
    kind.name: kind
    for kind in (
        BatchKind(
            "sft", "sft", "TRL conversational rows (messages + tools) of successful trajectories",
            make=lambda c, _res: SFTBuilder(c.sft), settings=_sft_settings,
            eligible=lambda b, t, _ctx: b.eligible(t), rows=_build, follow_default=True,
        ),
        BatchKind(
            "sft_tokenized", "sft", "pre-tokenized SFT rows, observations masked, chunked at steps",
            make=_tokenized, settings=_sft_settings,
            eligible=lambda b, t, _ctx: b.selector.eligible(t), rows=_build, needs_tokenizer=True,
        ),
        BatchKind(
            "dpo", "dpo", "trajectory-level preference pairs of one task (prompt/chosen/rejected)",
            make=lambda c, _res: DPOPairBuilder(c.dpo), settings=_dpo_settings,
            eligible=_has_reward, rows=_build, grouped=True,
        ),
        BatchKind(
            "dpo_step", "dpo", "step-level pairs: shared history, one diverging assistant turn",
            make=lambda c, _res: StepPairBuilder(c.dpo), settings=_dpo_settings,
            eligible=_has_reward, rows=_build, grouped=True, follow_default=True,
        ),
        BatchKind(
            "grpo", "grpo", "groups of one task with GRPO / RLOO advantages",
            make=lambda c, res: GRPOGroupBuilder(c.grpo, res.base_tokenizer_hash),
            settings=lambda c: c.grpo.to_dict() | _group_settings(c),
            eligible=lambda b, t, ctx: b.eligible(t, ctx.current_policy),
            rows=lambda b, ts, ctx: b.build(ts, complete=ctx.complete), report=lambda b: b.take_left_out(),
            grouped=True, group_key=lambda t: (t.task_id, t.group_id or ""), follow_default=True,
        ),
    )
}  # fmt: skip

METHODS: tuple[str, ...] = tuple(dict.fromkeys(kind.method for kind in KINDS.values()))
# `agentstream batch` builds every kind that needs nothing more than its options by default.
DEFAULT_KINDS: tuple[str, ...] = tuple(name for name, kind in KINDS.items() if not kind.needs_tokenizer)


def unknown_kinds(names: tuple[str, ...]) -> list[str]:
    """The names that are not batch kinds, sorted.

    >>> unknown_kinds(("sft", "ppo"))
    ['ppo']
    """
    return sorted(set(names) - set(KINDS))


def follow_kind(method: str) -> str:
    """The kind `train --follow --method <method>` trains on when `--kinds` is not given: plain SFT
    rows, step-level DPO pairs (observations never in the completion), GRPO groups.

    >>> [follow_kind(m) for m in ("sft", "dpo", "grpo")]
    ['sft', 'dpo_step', 'grpo']
    """
    return next(k.name for k in KINDS.values() if k.method == method and k.follow_default)

"""DPO pairs in TRL's conversational `prompt` / `chosen` / `rejected` form, at two granularities.

- `DPOPairBuilder`: whole trajectories of the same task, reward margin >= `min_margin`; strategy
  `best_vs_worst` (outside-in: best with worst, second with second-worst, each trajectory used once)
  or `all_pairs` (every pair over the margin, largest margins first, capped).
  The completion holds tool turns, so TRL trains on observations: prefer step pairs for agents.
- `StepPairBuilder`: two trajectories of the same task that agree on every step before step t and
  differ at t give prompt = shared history (observations included, never trained on), chosen /
  rejected = the single assistant turn at t.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Any, Literal

from consumers.batching.builders.common import BuilderConfig, reward_of
from consumers.batching.chat import (
    DEFAULT_SYSTEM_PROMPT,
    assistant_message,
    ordered_steps,
    prompt_messages,
    step_messages,
    tool_schemas,
)
from schemas.config_fields import option
from schemas.events import ScoredStep, TrajectoryScored


@dataclass(frozen=True)
class DPOPairConfig(BuilderConfig):
    """How pairs are chosen (TRL-style config). On the command line these options carry the
    `dpo-` prefix (`--dpo-min-margin`); group formation is `builders.groups.GroupConfig`."""

    # `flag` is given where a bound is, so that a refusal names the option as typed.
    min_margin: float = option(0.05, "DPO: minimum reward margin of a pair", flag="--dpo-min-margin", ge=0)
    strategy: Literal["best_vs_worst", "all_pairs"] = option("best_vs_worst", "DPO pairing")
    max_pairs_per_group: int = option(
        8, "DPO: pairs per task group at most", flag="--dpo-max-pairs", env="AGENTSTREAM_DPO_MAX_PAIRS", ge=1
    )
    step_preference: Literal["trajectory", "process"] = option(
        "trajectory", "step pairs: rank by trajectory reward, or by the diverging steps' process_score"
    )
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    include_tools: bool = True


def ranked(trajectories: list[TrajectoryScored]) -> list[tuple[TrajectoryScored, float]]:
    """Trajectories with a reward, best first (ties by trajectory id, so the order is stable)."""
    scored = [(t, r) for t in trajectories if (r := reward_of(t)) is not None]
    return sorted(scored, key=lambda tr: (-tr[1], tr[0].trajectory_id))


def candidate_pairs(
    trajectories: list[TrajectoryScored], config: DPOPairConfig
) -> list[tuple[TrajectoryScored, TrajectoryScored, float]]:
    """(chosen, rejected, margin) per the strategy.

    Outside-in on rewards .9 .52 .5 .2 .1 gives (.9, .1) and (.52, .2); .5 stays unpaired.
    """
    order = ranked(trajectories)
    if config.strategy == "best_vs_worst":
        pairs = [(order[i], order[len(order) - 1 - i]) for i in range(len(order) // 2)]
    else:
        pairs = list(combinations(order, 2))
    out = [(a, b, ra - rb) for (a, ra), (b, rb) in pairs if ra - rb >= config.min_margin - 1e-12]
    out.sort(key=lambda p: (-p[2], p[0].trajectory_id, p[1].trajectory_id))
    return out[: config.max_pairs_per_group]


class DPOPairBuilder:
    """Trajectory-level pairs."""

    def __init__(self, config: DPOPairConfig | None = None):
        self.config = config or DPOPairConfig()

    def build(self, trajectories: list[TrajectoryScored]) -> list[dict[str, Any]]:
        """Pairs among `trajectories` (callers pass one task's group)."""
        rows = []
        for chosen, rejected, margin in candidate_pairs(trajectories, self.config):
            row = {
                "prompt": prompt_messages(chosen, self.config.system_prompt),
                "chosen": [m for s in ordered_steps(chosen) for m in step_messages(s)],
                "rejected": [m for s in ordered_steps(rejected) for m in step_messages(s)],
            }
            rows.append(
                _with_tools(row, [chosen, rejected], self.config) | _pair_lineage(chosen, rejected, margin)
            )
        return rows


class StepPairBuilder:
    """Step-level pairs: shared history as the prompt, one assistant step as chosen and rejected."""

    def __init__(self, config: DPOPairConfig | None = None):
        self.config = config or DPOPairConfig()

    def build(self, trajectories: list[TrajectoryScored]) -> list[dict[str, Any]]:
        rows = []
        for a, b in combinations(sorted(trajectories, key=lambda t: t.trajectory_id), 2):
            row = self.pair(a, b)
            if row is not None:
                rows.append(row)
        rows.sort(key=lambda r: (-r["margin"], r["chosen_trajectory_id"], r["rejected_trajectory_id"]))
        return rows[: self.config.max_pairs_per_group]

    def pair(self, a: TrajectoryScored, b: TrajectoryScored) -> dict[str, Any] | None:
        """The step pair of two trajectories, or None (no divergence, no margin, no reward)."""
        t = divergence(a, b)
        if t is None:
            return None
        step_a, step_b = ordered_steps(a)[t], ordered_steps(b)[t]
        scores = self._scores(a, b, step_a, step_b)
        if scores is None:
            return None
        (chosen, c_step), (rejected, r_step), margin = _order_pair((a, step_a), (b, step_b), scores)
        if margin < self.config.min_margin - 1e-12:
            return None
        history = [m for s in ordered_steps(chosen)[:t] for m in step_messages(s)]
        row = {
            "prompt": prompt_messages(chosen, self.config.system_prompt) + history,
            "chosen": [assistant_message(c_step)],
            "rejected": [assistant_message(r_step)],
        }
        return (
            _with_tools(row, [a, b], self.config)
            | _pair_lineage(chosen, rejected, margin)
            | {"step_index": t}
        )

    def _scores(self, a, b, step_a: ScoredStep, step_b: ScoredStep) -> tuple[float, float] | None:
        both = step_a.process_score is not None and step_b.process_score is not None
        if self.config.step_preference == "process" and both:
            return step_a.process_score, step_b.process_score
        ra, rb = reward_of(a), reward_of(b)
        return None if ra is None or rb is None else (ra, rb)


def divergence(a: TrajectoryScored, b: TrajectoryScored) -> int | None:
    """The first step position where the two agents acted differently after identical histories.

    None if one is a prefix of the other or they never differ.
    """
    for t, (sa, sb) in enumerate(zip(ordered_steps(a), ordered_steps(b), strict=False)):
        if _action(sa) != _action(sb):
            return t
        if sa.observation != sb.observation or sa.error != sb.error:
            return None  # same action, different world: later steps do not share a state
    return None


def _action(step: ScoredStep) -> tuple:
    return (step.thought, step.tool, sorted(step.params.items(), key=lambda kv: kv[0]).__repr__())


def _order_pair(a, b, scores: tuple[float, float]):
    (ta, sa), (tb, sb) = a, b
    if scores[0] > scores[1] or (scores[0] == scores[1] and ta.trajectory_id < tb.trajectory_id):
        return (ta, sa), (tb, sb), scores[0] - scores[1]
    return (tb, sb), (ta, sa), scores[1] - scores[0]


def _with_tools(row: dict, trajectories: list[TrajectoryScored], config: DPOPairConfig) -> dict:
    return row | {"tools": tool_schemas(trajectories)} if config.include_tools else row


def _pair_lineage(chosen: TrajectoryScored, rejected: TrajectoryScored, margin: float) -> dict[str, Any]:
    return {
        "task_id": chosen.task_id,
        "chosen_trajectory_id": chosen.trajectory_id,
        "rejected_trajectory_id": rejected.trajectory_id,
        "chosen_reward": reward_of(chosen),
        "rejected_reward": reward_of(rejected),
        "margin": round(margin, 12),
    }

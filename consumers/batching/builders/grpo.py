"""GRPO / RLOO groups: per-trajectory (and optionally per-step) advantages over complete groups.

- Advantages: `grpo` A_i = (r_i - mean) / (std + eps) (std unbiased as in TRL / AgentGym-RL, or
  population as in ART; `scale_rewards=False` gives Dr. GRPO's r_i - mean), or `rloo`
  A_i = r_i - mean_{j != i} r_j. A singleton group gets A = 0 (never the raw reward).
- Step advantages from process rewards: `process_return` G_{i,s} = sum_{k>=s} gamma^(k-s) p_{i,k}
  + gamma^(T_i-s) R_i, normalised over every step of the group; `mixed` (MT-GRPO)
  A_{i,s} = A_i + lambda * z(p_{i,s}) with z taken within the group at the same step index.
  A step without a process score contributes p = 0 (absent, not neutral).
- Staleness: trajectories whose policy version lags the current one by more than `max_policy_lag`
  are not admitted (`is_fresh`; versions numbered by `schemas.policy_versions`, a missing one is
  `base`). Under a bound, a version without a number (unknown format) is not admitted either: its
  lag cannot be measured; each such version is logged once.
- Token rows: a trajectory whose every step carries the token ids the policy server recorded
  (completion ids + logprobs, prompt delta) becomes a row of `input_ids`, `labels`, `step_ids`,
  `behaviour_logprobs` (consumers/batching/token_rows.py), no re-tokenisation; broken steps are not
  trained. A trajectory without token ids is left to SFT/DPO unless `retokenize` (message rows,
  re-tokenised by the trainer: not token-faithful). A trajectory with no trainable token gives no row.
- One base: token ids mean something only to the tokenizer that made them. With the training base's
  tokenizer hash given (`base_tokenizer.BaseTokenizerHash`, from `--base-model`), a trajectory with a
  step recorded under another `tokenizer_hash` is left out of its group before the advantages (no
  row), logged, and counted: `take_left_out()` gives the steps (`left_out_by_tokenizer`) and
  trajectories left out since the last batch, which the batch records in its `builder_config`. A step
  that names no tokenizer (recorded elsewhere, or before 1.4) is not checked.
- No horizon cut here: the ScalingInter-RL horizon is enforced by the rollout driver while the
  episode runs (`agentstream rollout --horizon`), so a row keeps every step of its trajectory and the
  reward is judged on what the agent did.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from consumers.batching.builders.common import BuilderConfig, policy_lag, reward_of
from consumers.batching.builders.sft import lineage
from consumers.batching.chat import (
    DEFAULT_SYSTEM_PROMPT,
    ordered_steps,
    prompt_messages,
    step_messages,
    tool_schemas,
)
from consumers.batching.token_rows import has_tokens, replay
from schemas.config_fields import option
from schemas.events import TrajectoryScored
from schemas.policy_versions import BASE_VERSION, version_number

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GRPOGroupConfig(BuilderConfig):
    """Advantage estimation over a group (TRL-style config; the fields with help are `agentstream
    batch` options). Group formation is `builders.groups.GroupConfig`."""

    estimator: Literal["grpo", "rloo"] = option("grpo", "GRPO advantage estimator")
    scale_rewards: bool = option(True, "GRPO: divide by the group std")
    std: Literal["unbiased", "population"] = "unbiased"
    eps: float = 1e-6
    drop_zero_std: bool = option(
        False, "GRPO: no rows for a group whose rewards are all equal (advantages all 0)"
    )
    step_advantage: Literal["none", "process_return", "mixed"] = option("none", "GRPO step advantages")
    gamma: float = option(1.0, "GRPO: discount of process-reward returns")
    step_weight: float = 0.5
    """lambda of the `mixed` step advantage."""
    max_policy_lag: int | None = option(None, "GRPO: drop trajectories more than N policy versions old", ge=0)
    retokenize: bool = option(
        False,
        "GRPO also on trajectories without recorded token ids, re-tokenised (not token-faithful; for logs)",
    )
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    include_tools: bool = True


def _std(values: list[float], unbiased: bool) -> float:
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1 if unbiased else n))


def group_advantages(rewards: list[float], config: GRPOGroupConfig | None = None) -> list[float]:
    """Per-trajectory advantages of one group.

    >>> [round(a, 4) for a in group_advantages([1.0, 0.0, 0.5])]
    [1.0, -1.0, 0.0]
    >>> group_advantages([1.0, 0.0, 0.5], GRPOGroupConfig(estimator="rloo"))
    [0.75, -0.75, 0.0]
    """
    config = config or GRPOGroupConfig()
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    mean = sum(rewards) / n
    if config.estimator == "rloo":
        total = sum(rewards)
        return [r - (total - r) / (n - 1) for r in rewards]
    if not config.scale_rewards:
        return [r - mean for r in rewards]
    std = _std(rewards, config.std == "unbiased")
    return [(r - mean) / (std + config.eps) for r in rewards]


def _zscore(values: list[float], config: GRPOGroupConfig) -> list[float]:
    if len(values) < 2:
        return [0.0] * len(values)
    mean = sum(values) / len(values)
    std = _std(values, config.std == "unbiased")
    return [(v - mean) / (std + config.eps) for v in values]


def process_returns(process: list[float | None], outcome: float, gamma: float) -> list[float]:
    """G_s = sum_{k>=s} gamma^(k-s) p_k + gamma^(T-s) R, for one trajectory.

    >>> process_returns([0.5, None, 1.0], 1.0, 1.0)
    [2.5, 2.0, 2.0]
    """
    out, running = [], outcome
    for p in reversed(process):
        running = (p or 0.0) + gamma * running
        out.append(running)
    return list(reversed(out))


def step_advantages(
    group: list[TrajectoryScored], advantages: list[float], config: GRPOGroupConfig
) -> list[list[float]] | None:
    """Per-step advantages for each trajectory of the group, or None when not configured."""
    if config.step_advantage == "none":
        return None
    process = [[s.process_score for s in ordered_steps(t)] for t in group]
    if config.step_advantage == "process_return":
        returns = [
            process_returns(p, reward_of(t) or 0.0, config.gamma) for p, t in zip(process, group, strict=True)
        ]
        flat = _zscore([g for row in returns for g in row], config)
        out, i = [], 0
        for row in returns:
            out.append(flat[i : i + len(row)])
            i += len(row)
        return out
    depth = max((len(p) for p in process), default=0)
    by_index = [_zscore([p[s] or 0.0 for p in process if s < len(p)], config) for s in range(depth)]
    out = []
    for i, p in enumerate(process):
        position = [sum(1 for q in process[:i] if s < len(q)) for s in range(len(p))]
        out.append([advantages[i] + config.step_weight * by_index[s][position[s]] for s in range(len(p))])
    return out


def is_fresh(trajectory: TrajectoryScored, current_policy: str | None, config: GRPOGroupConfig) -> bool:
    """False when the trajectory's policy version lags `current_policy` by more than
    `max_policy_lag` (`common.policy_lag`: `base` is 9 behind `v9`), or when a bound is set and the
    lag cannot be measured (a version without a number); no bound admits everything."""
    if config.max_policy_lag is None:
        return True
    lag = policy_lag(trajectory.policy_version, current_policy)
    return lag is not None and lag <= config.max_policy_lag


class GRPOGroupBuilder:
    """Rows of one group: one per trajectory, with its advantage."""

    def __init__(
        self, config: GRPOGroupConfig | None = None, base_tokenizer_hash: Callable[[], str] | None = None
    ):
        self.config = config or GRPOGroupConfig()
        self._unmeasured: set[tuple[str | None, str | None]] = set()  # (version, current) logged
        self.base_tokenizer_hash = base_tokenizer_hash  # None: recorded tokenizers are not checked
        self._left_out = {"left_out_by_tokenizer": 0, "left_out_by_tokenizer_trajectories": 0}

    def eligible(self, trajectory: TrajectoryScored, current_policy: str | None = None) -> bool:
        return (
            bool(trajectory.steps)
            and reward_of(trajectory) is not None
            and self._fresh(trajectory, current_policy)
            and (self.config.retokenize or has_tokens(ordered_steps(trajectory)))
        )

    def _fresh(self, trajectory: TrajectoryScored, current_policy: str | None) -> bool:
        """`is_fresh`, with one warning per version pair dropped because its lag is unmeasurable."""
        if is_fresh(trajectory, current_policy, self.config):
            return True
        pair = (trajectory.policy_version, current_policy)
        if policy_lag(*pair) is None and pair not in self._unmeasured:
            self._unmeasured.add(pair)
            log.warning(
                "grpo: not admitting trajectories of policy version %r: max_policy_lag is set and "
                "their lag behind the current policy %r cannot be measured (a version without a number)",
                *pair,
            )
        return False

    def build(self, group: list[TrajectoryScored], *, complete: bool = True) -> list[dict[str, Any]]:
        """One row per trajectory, every step kept: the horizon is the rollout driver's, enforced
        while the episode runs (see the module docstring)."""
        group = sorted(group, key=lambda t: t.trajectory_id)
        kept = self._same_tokenizer(group)
        group, complete = kept, complete and len(kept) == len(group)
        if not group:
            return []
        rewards = [reward_of(t) or 0.0 for t in group]
        if self.config.drop_zero_std and len(set(rewards)) <= 1:
            return []
        advantages = group_advantages(rewards, self.config)
        steps_adv = step_advantages(group, advantages, self.config)
        rows = [
            self._row(t, advantages[i], steps_adv[i] if steps_adv else None, len(group), complete)
            for i, t in enumerate(group)
        ]
        return [row for row in rows if row is not None]

    def _same_tokenizer(self, group: list[TrajectoryScored]) -> list[TrajectoryScored]:
        """The members with no step recorded under another tokenizer than the training base's; the
        others are counted and logged. The base's hash is asked for only when a step names one."""
        recorded = {t.trajectory_id: [s.tokenizer_hash for s in t.steps if s.tokenizer_hash] for t in group}
        if self.base_tokenizer_hash is None or not any(recorded.values()):
            return group
        base = self.base_tokenizer_hash()
        foreign = {tid: [h for h in hashes if h != base] for tid, hashes in recorded.items()}
        out = [t for t in group if foreign[t.trajectory_id]]
        if out:
            steps = sum(len(foreign[t.trajectory_id]) for t in out)
            self._left_out["left_out_by_tokenizer"] += steps
            self._left_out["left_out_by_tokenizer_trajectories"] += len(out)
            log.warning(  # a recorded hash is input: repr keeps it on one line
                "grpo: group %s: %d of %d trajectories left out (%d steps recorded with tokenizer %s, "
                "not the training base's %s: check --base-model / AGENTSTREAM_BASE_MODEL)",
                group[0].group_id or group[0].task_id, len(out), len(group), steps,
                ", ".join(sorted({repr(h) for t in out for h in foreign[t.trajectory_id]})), base,
            )  # fmt: skip
        return [t for t in group if not foreign[t.trajectory_id]]

    def take_left_out(self) -> dict[str, int]:
        """Steps (`left_out_by_tokenizer`) and trajectories left out for their tokenizer since the
        last call; the counters restart at 0."""
        counts, self._left_out = self._left_out, dict.fromkeys(self._left_out, 0)
        return counts

    def _row(self, t: TrajectoryScored, advantage, step_adv, size, complete) -> dict[str, Any] | None:
        kept = ordered_steps(t)
        body = token_row(t) if has_tokens(kept) else None
        if body is None and not self.config.retokenize:
            return None
        if body is None and has_tokens(kept):
            return None  # recorded tokens with nothing trainable: never re-tokenise those
        if body is None:
            body = self._message_row(t, kept)
        return (
            body
            | lineage(t)
            | {
                "group_id": t.group_id or "",
                "group_size": size,
                "group_complete": complete,
                "advantage": advantage,
                "step_advantages": step_adv,
                "step_event_ids": [s.event_id for s in kept],
            }
        )

    def _message_row(self, t: TrajectoryScored, kept) -> dict[str, Any]:
        """The re-tokenised row (`retokenize`): messages the trainer renders with its template."""
        row: dict[str, Any] = {
            "prompt": prompt_messages(t, self.config.system_prompt),
            "completion": [m for s in kept for m in step_messages(s)],
        }
        if self.config.include_tools:
            row["tools"] = tool_schemas([t])
        if all(s.token_ids is not None for s in kept):  # completion ids without the prompt deltas
            row["step_token_ids"] = [s.token_ids for s in kept]
            row["step_logprobs"] = [s.logprobs for s in kept] if all(s.logprobs for s in kept) else None
        return row


def behaviour_version(t: TrajectoryScored) -> str:
    """The oldest policy version that sampled a step ("base" when none says otherwise), as the
    executor's staleness check reads it; a step without its own version has the trajectory's.
    Unknown-format versions count as the oldest (`schemas.policy_versions` order).

    >>> from schemas.events import ScoredStep
    >>> t = TrajectoryScored(event_id="e", trajectory_id="t", occurred_at="2026-01-01T00:00:00Z",
    ...     producer="p", task_id="k", policy_version="v3",
    ...     steps=[ScoredStep(step_index=0, policy_version="v2"), ScoredStep(step_index=1)])
    >>> behaviour_version(t)
    'v2'
    """
    versions = [s.policy_version or t.policy_version for s in t.steps] or [t.policy_version]
    return min((v or BASE_VERSION for v in versions), key=_version_rank)


def _version_rank(version: str) -> tuple[bool, int]:
    """Oldest first, in `schemas.policy_versions` order: unknown-format versions rank below every
    numbered one (so a step sampled by one makes its row unmeasurable, not fresh)."""
    number = version_number(version)
    return (number is not None, number if number is not None else -1)


def token_row(t: TrajectoryScored) -> dict[str, Any] | None:
    """The token-faithful part of a row from the recorded token ids; None when nothing is trainable
    (every step broken) or the record does not replay."""
    seq = replay(ordered_steps(t))
    if seq is None or seq.trainable() == 0:
        return None
    return seq.as_dict() | {"behaviour_version": behaviour_version(t)}

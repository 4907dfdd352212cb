"""SFT rows in TRL's conversational format: `messages` (+ `tools`), selected by success / reward.

Rows carry lineage columns (`trajectory_id`, `task_id`, `reward`, `policy_version`) beside the TRL
columns; trainers ignore columns they do not use. Pre-tokenized rows are built by `tokenize.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from consumers.batching.builders.common import BuilderConfig, reward_of
from consumers.batching.builders.curriculum import curriculum_order
from consumers.batching.chat import DEFAULT_SYSTEM_PROMPT, ordered_steps, tool_schemas, trajectory_messages
from schemas.config_fields import option
from schemas.events import TrajectoryScored


@dataclass(frozen=True)
class SFTBuilderConfig(BuilderConfig):
    """Which trajectories become SFT examples and how they are rendered (TRL-style config; the
    fields with help are `agentstream batch` options)."""

    require_success: bool = option(
        True, "SFT: only successful trajectories (success=None counts as not successful)"
    )
    min_reward: float | None = option(None, "SFT: only trajectories with at least this reward")
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    include_tools: bool = True
    curriculum: bool = option(False, "SFT: order rows easiest first (short, high reward)")
    max_length: int = option(
        2048, "tokens per pre-tokenized row; longer trajectories are split at steps", ge=1
    )
    chunk_context_steps: int = option(0, "masked previous steps repeated at the start of each chunk", ge=0)


class SFTBuilder:
    """Selects and renders SFT rows.

    >>> from schemas.events import TrajectoryScored, ScoredStep
    >>> t = TrajectoryScored(event_id="e", trajectory_id="t1", occurred_at="2026-01-01T00:00:00Z",
    ...     producer="p", task_id="k", task="list files", success=True,
    ...     steps=[ScoredStep(step_index=0, thought="look", tool="ls", observation="a.txt")])
    >>> [m["role"] for m in SFTBuilder().build([t])[0]["messages"]]
    ['system', 'user', 'assistant', 'tool']
    """

    def __init__(self, config: SFTBuilderConfig | None = None):
        self.config = config or SFTBuilderConfig()

    def eligible(self, trajectory: TrajectoryScored) -> bool:
        if not trajectory.steps:
            return False
        if self.config.require_success and trajectory.success is not True:
            return False
        if self.config.min_reward is not None:
            reward = reward_of(trajectory)
            return reward is not None and reward >= self.config.min_reward
        return True

    def row(self, trajectory: TrajectoryScored) -> dict[str, Any]:
        row: dict[str, Any] = {"messages": trajectory_messages(trajectory, self.config.system_prompt)}
        if self.config.include_tools:
            row["tools"] = tool_schemas([trajectory])
        row["step_rewards"] = [s.process_score for s in ordered_steps(trajectory)]
        return row | lineage(trajectory)

    def build_trajectories(self, trajectories: list[TrajectoryScored]) -> list[TrajectoryScored]:
        """The eligible trajectories, in curriculum order when configured."""
        chosen = [t for t in trajectories if self.eligible(t)]
        return curriculum_order(chosen) if self.config.curriculum else chosen

    def build(self, trajectories: list[TrajectoryScored]) -> list[dict[str, Any]]:
        return [self.row(t) for t in self.build_trajectories(trajectories)]


def lineage(trajectory: TrajectoryScored) -> dict[str, Any]:
    """The lineage columns every row carries."""
    return {
        "trajectory_id": trajectory.trajectory_id,
        "task_id": trajectory.task_id,
        "reward": reward_of(trajectory),
        "policy_version": trajectory.policy_version,
    }

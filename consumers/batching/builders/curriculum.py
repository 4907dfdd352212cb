"""Curriculum ordering: short, high-reward trajectories first (easy before hard).

difficulty = number of steps - reward (the seed's formula, applied before chunking so indices stay
aligned); ties broken by trajectory id so the order is deterministic.
"""

from __future__ import annotations

from consumers.batching.builders.common import reward_of
from schemas.events import TrajectoryScored


def difficulty(trajectory: TrajectoryScored) -> float:
    """Steps minus reward (missing reward counts as 0).

    >>> from schemas.events import TrajectoryScored
    >>> t = TrajectoryScored(event_id="e", trajectory_id="t", occurred_at="2026-01-01T00:00:00Z",
    ...     producer="p", task_id="k", total_steps=3, total_reward=0.5)
    >>> difficulty(t)
    2.5
    """
    steps = len(trajectory.steps) or trajectory.total_steps
    return steps - (reward_of(trajectory) or 0.0)


def curriculum_order(trajectories: list[TrajectoryScored]) -> list[TrajectoryScored]:
    """Trajectories sorted easiest first."""
    return sorted(trajectories, key=lambda t: (difficulty(t), t.trajectory_id))

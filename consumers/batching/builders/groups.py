"""Group collection for GRPO and DPO: trajectories of one task gathered until the group is full.

A group is emitted `complete=True` only when it reached `group_size`; after `timeout_s` without
reaching it, a group of at least `min_group_size` is emitted with `complete=False` (never as if it
were complete). Smaller groups keep waiting. Time is passed in, so this is a pure state machine.
Within a pending group a later revision of a trajectory replaces the earlier one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from consumers.batching.builders.common import BuilderConfig
from schemas.config_fields import option
from schemas.events import TrajectoryScored

Item = TypeVar("Item")


@dataclass(frozen=True)
class GroupConfig(BuilderConfig):
    """How trajectories of one task are gathered into a group: shared by DPO and GRPO (TRL-style
    config; `agentstream batch` options are generated from its fields)."""

    group_size: int = option(4, "GRPO/DPO: trajectories per group", ge=1)
    min_group_size: int = option(2, "GRPO/DPO: smallest group emitted after the timeout", ge=1)
    timeout_s: float = option(
        300.0,
        "GRPO/DPO: wait this long for a full group",
        flag="--group-timeout-s",
        env="AGENTSTREAM_GROUP_TIMEOUT_S",
        ge=0,
    )

    def collector(self) -> GroupCollector:
        """An empty collector with these settings."""
        return GroupCollector(self.group_size, self.min_group_size, self.timeout_s)


@dataclass
class Member(Generic[Item]):
    trajectory: TrajectoryScored
    item: Item


@dataclass
class Group(Generic[Item]):
    key: tuple[str, ...]
    members: list[Member[Item]]
    first_seen: float
    complete: bool = False

    @property
    def trajectories(self) -> list[TrajectoryScored]:
        return [m.trajectory for m in self.members]


@dataclass
class GroupCollector(Generic[Item]):
    """Collects members per key. `item` is whatever the caller attaches (e.g. source offsets)."""

    group_size: int
    min_group_size: int
    timeout_s: float
    pending: dict[tuple[str, ...], Group[Item]] = field(default_factory=dict)

    def add(self, key: tuple[str, ...], trajectory: TrajectoryScored, item: Item, now: float) -> list[Group]:
        """Add one trajectory; returns the groups this completed (zero or one)."""
        group = self.pending.get(key)
        if group is None:
            group = self.pending[key] = Group(key, [], now)
        for i, member in enumerate(group.members):
            if member.trajectory.trajectory_id == trajectory.trajectory_id:
                if trajectory.revision >= member.trajectory.revision:
                    group.members[i] = Member(trajectory, item)
                return []
        group.members.append(Member(trajectory, item))
        if len(group.members) >= self.group_size:
            del self.pending[key]
            group.complete = True
            return [group]
        return []

    def discard(self, trajectory_id: str) -> None:
        """Forget a pending trajectory (its latest revision is no longer eligible)."""
        for key, group in list(self.pending.items()):
            group.members = [m for m in group.members if m.trajectory.trajectory_id != trajectory_id]
            if not group.members:
                del self.pending[key]

    def expire(self, now: float) -> list[Group]:
        """Groups past their timeout that have at least `min_group_size` members (complete=False)."""
        due = [
            k
            for k, g in self.pending.items()
            if now - g.first_seen >= self.timeout_s and len(g.members) >= self.min_group_size
        ]
        return [self.pending.pop(k) for k in sorted(due)]

    def items(self) -> list[Item]:
        """Every item still waiting in a group (the consumer holds their offsets back)."""
        return [m.item for g in self.pending.values() for m in g.members]

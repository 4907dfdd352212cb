"""Shared pieces of the builders: what their configs do, the reward a builder ranks by, and policy
versions. (Where a trajectory was read is a `schemas.records.Record`.)"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

from consumers.errors import ConsumerConfigError
from schemas.config_fields import check_bounds
from schemas.events import TrajectoryScored

_TRAILING_INT = re.compile(r"(\d+)$")


class BuilderConfig:
    """What every builder config (a frozen dataclass of `option` fields) does: its bounds are
    checked when it is made, and `to_dict()` is the form a batch records as its `builder_config`."""

    def __post_init__(self):
        check_bounds(self, ConsumerConfigError)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


def reward_of(trajectory: TrajectoryScored) -> float | None:
    """The scalar a builder ranks by: `total_reward`, else `outcome_score`, else success as 1/0.

    None when the trajectory carries no signal at all (never a neutral 0.5).

    >>> from schemas.events import TrajectoryScored
    >>> t = TrajectoryScored(event_id="e", trajectory_id="t", occurred_at="2026-01-01T00:00:00Z",
    ...     producer="p", task_id="k", success=True)
    >>> reward_of(t)
    1.0
    """
    if trajectory.total_reward is not None:
        return float(trajectory.total_reward)
    if trajectory.outcome_score is not None:
        return float(trajectory.outcome_score)
    if trajectory.success is not None:
        return 1.0 if trajectory.success else 0.0
    return None


def policy_number(version: str | None) -> int | None:
    """The integer a policy version ends with ("v12" -> 12, "7" -> 7); None if it has none.

    >>> policy_number("policy-v12"), policy_number("base")
    (12, None)
    """
    if not version:
        return None
    match = _TRAILING_INT.search(version)
    return int(match.group(1)) if match else None


def sorted_versions(values: set[str | None]) -> list[str]:
    """Distinct non-empty versions, sorted (for manifests)."""
    return sorted(v for v in values if v)

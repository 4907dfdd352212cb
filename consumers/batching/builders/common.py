"""Shared pieces of the builders: what their configs do, the reward a builder ranks by, and how far
one policy version lags another. (Where a trajectory was read is a `schemas.records.Record`.)"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from consumers.errors import ConsumerConfigError
from schemas.config_fields import check_bounds
from schemas.events import TrajectoryScored
from schemas.policy_versions import BASE_VERSION, version_number


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


def policy_lag(sampled_by: str | None, current: str | None) -> int | None:
    """How many versions `sampled_by` is behind `current`, by `schemas.policy_versions` numbers; the
    staleness the GRPO builder (`max_policy_lag`) and the executor (`--max-staleness`) both bound.

    A missing version (None, "") is `base`, the policy before any update. The same version lags by 0.
    None when either version has no number (unknown format, e.g. `nightly`): the lag cannot be
    measured, so under a bound it is never fresh (the callers drop it and log why).

    >>> policy_lag("base", "v9"), policy_lag(None, "v1"), policy_lag("v5", "v3"), policy_lag("v2", None)
    (9, 1, -2, -2)
    >>> policy_lag("nightly", "v3"), policy_lag("v3", "nightly"), policy_lag("nightly", "nightly")
    (None, None, 0)
    """
    sampled_by, current = sampled_by or BASE_VERSION, current or BASE_VERSION
    if sampled_by == current:
        return 0
    have, now = version_number(sampled_by), version_number(current)
    if have is None or now is None:
        return None
    return now - have


def sorted_versions(values: set[str | None]) -> list[str]:
    """Distinct non-empty versions, sorted (for manifests)."""
    return sorted(v for v in values if v)

"""The batch builder's reward-version selection (pure planner, no broker)."""

from __future__ import annotations

import pytest

from consumers.batching.config import PlannerConfig
from consumers.batching.planner import Planner
from consumers.errors import ConsumerConfigError
from schemas.records import Record
from tests.support.trainer_data import golden_group


def _offered(selected: str, stamped: str) -> int:
    planner = Planner(PlannerConfig(kinds=("sft",), reward_version=selected))
    for i, t in enumerate(golden_group()):
        planner.offer(
            t.model_copy(update={"reward_version": stamped}), Record("trajectory.scored", 0, i), 0.0
        )
    return len(planner.lanes["sft"].pending_entries())


@pytest.mark.parametrize(
    ("selected", "stamped", "taken"),
    [
        ("rules-1", "assembly-1+rules-1", True),  # the default: what the live rules stamp
        ("rules-2", "assembly-1+rules-1", False),
        ("assembly-1+rules-2", "assembly-1+rules-2", True),
        ("rules-2", "assembly-1+rules-1+rules-2", False),  # a mixed assembly is no version's
        ("any", "assembly-1+rules-7", True),
        ("rules-2", "", True),  # unversioned (before versions existed): taken under any selection
    ],
)
def test_only_the_selected_version_reaches_the_lanes(selected, stamped, taken):
    eligible = _offered("any", stamped)  # what the SFT lane takes of the group at all
    assert eligible == 3 and _offered(selected, stamped) == (eligible if taken else 0)


def test_skipped_versions_are_counted_and_the_option_is_checked():
    planner = Planner(PlannerConfig(kinds=("sft",), reward_version="rules-2"))
    for i, t in enumerate(golden_group()):
        planner.offer(t.model_copy(update={"reward_version": "assembly-1+rules-1"}), Record("t", 0, i), 0.0)
    assert planner.other_versions == {"assembly-1+rules-1": 4}
    assert PlannerConfig().reward_version == "rules-1"
    with pytest.raises(ConsumerConfigError, match="--reward-version"):
        PlannerConfig(reward_version=" ")

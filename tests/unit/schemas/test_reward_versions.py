"""The reward-version contract: `reward.version.completed` on its compacted topic, and how a
trajectory's version relates to a rules version (docs/reward-versions.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from schemas.codec import decode, encode, encode_key
from schemas.events import RewardVersionCompleted
from schemas.export import json_schema
from schemas.topics import REWARD_VERSIONS, TOPICS, topic_for
from schemas.versions import reward_version_matches, rules_version_of

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def test_the_event_round_trips_on_a_compacted_topic_keyed_by_version():
    event = RewardVersionCompleted(
        event_id="e1", trajectory_id="reward-version:rules-2", occurred_at=T0, producer="replay",
        version="rules-2", roles=["rules", "assembler"], source_end_offsets={"agent.events": {"1": 9}},
        started_at=T0 - timedelta(minutes=5), completed_at=T0,
    )  # fmt: skip
    assert decode(encode(event)) == event and isinstance(decode(encode(event)), RewardVersionCompleted)
    assert topic_for(event.type) == REWARD_VERSIONS and encode_key(event) == b"reward-version:rules-2"
    assert TOPICS[REWARD_VERSIONS].config["cleanup.policy"] == "compact"
    assert {"version", "started_at", "completed_at"} <= set(json_schema(event.type)["required"])
    with pytest.raises(ValidationError, match="version"):
        RewardVersionCompleted.model_validate({**event.model_dump(), "version": ""})


@pytest.mark.parametrize(
    ("stamped", "selected", "matches"),
    [
        ("assembly-1+rules-2", "rules-2", True),
        ("assembly-1+rules-2", "assembly-1+rules-2", True),
        ("assembly-1+rules-2", "rules-1", False),
        ("assembly-2+rules-2", "rules-2", True),  # a new assembly of the same rules
        ("assembly-1+rules-1+rules-2", "rules-2", False),  # mixed: no single version's
        ("", "", False),
    ],
)
def test_a_rules_version_selects_the_trajectory_versions_built_on_it(stamped, selected, matches):
    assert reward_version_matches(stamped, selected) is matches
    assert rules_version_of("assembly-1+rules-2") == "rules-2"

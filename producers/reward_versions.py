"""Registering a completed reward version: the `reward.version.completed` event a replay publishes
when it has processed every source record up to its end offsets (docs/reward-versions.md).

`agentstream replay` calls `publish_completed` once, after its worker committed the end offsets.
The sink writes the event to `agentstream.reward_versions`; readers (leaderboard, trajectory pages)
then default to the newest completed version that has trajectories in ClickHouse.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime

from clients.kafka import ensure_topics, make_producer
from schemas.codec import encode, encode_key
from schemas.events import RewardVersionCompleted, utc_now
from schemas.ids import derived_event_id
from schemas.topics import REWARD_VERSIONS, TOPICS

log = logging.getLogger(__name__)
PRODUCER = "replay"


def completed_event(
    version: str,
    roles: Iterable[str],
    ends: Mapping[tuple[str, int], int],
    started_at: datetime,
    completed_at: datetime | None = None,
    *,
    since: datetime | None = None,
    app_id: str = "",
) -> RewardVersionCompleted:
    """The event for a replay of `version` that covered `ends` ((topic, partition) -> end offset, as
    in `infra.replay.ReplayPlan.ends`). Its id derives from the version and the start time: the same
    run published twice is one row.

    >>> from datetime import UTC, datetime
    >>> e = completed_event("rules-2", ["rules"], {("agent.events", 0): 5}, datetime(2026, 1, 1, tzinfo=UTC))
    >>> e.trajectory_id, e.source_end_offsets
    ('reward-version:rules-2', {'agent.events': {'0': 5}})
    """
    offsets: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(ends.items()):
        offsets.setdefault(topic, {})[str(partition)] = int(offset)
    done = completed_at or utc_now()
    return RewardVersionCompleted(
        event_id=derived_event_id("reward.version.completed", version, started_at.isoformat()),
        trajectory_id=f"reward-version:{version}",
        occurred_at=done,
        producer=PRODUCER,
        version=version,
        roles=sorted(set(roles)),
        source_end_offsets=offsets,
        since=since,
        started_at=started_at,
        completed_at=done,
        app_id=app_id,
    )


def publish_completed(bootstrap_servers: str, event: RewardVersionCompleted, timeout_s: float = 30.0) -> None:
    """Publish `event` on `reward.versions` and wait for the broker's acknowledgement."""
    ensure_topics(bootstrap_servers, [TOPICS[REWARD_VERSIONS]], timeout_s=timeout_s)
    producer = make_producer(bootstrap_servers, "agentstream-replay-registry")
    try:
        producer.send(REWARD_VERSIONS, key=encode_key(event), value=encode(event)).get(timeout=timeout_s)
        producer.flush(timeout=timeout_s)
    finally:
        producer.close()
    log.info("registered reward version %s as completed (roles %s)", event.version, ",".join(event.roles))

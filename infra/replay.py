"""`agentstream replay`: recompute derived topics from the log under a reward version (issue #17).

A replay runs a stream role as a worker of its own consumer group, `agentstream-replay-<version>-
<run>-<role>` (a fresh group and fresh state each run), from the beginning of its source topics or
from the first record at or after `--since`, and writes to the same derived topics as the live role.
It stops once the group has committed every source partition up to the end offsets read when the
replay started (records published later are the live role's business), printing progress and lag.

Why the results can be compared: a derived event's id is a function of its input and its version
(the rules: `derived_event_id("reward.rule.step", source_event_id, reward_version)`), so a replay
under the same version re-publishes identical events, which every store drops by `event_id`, and a
replay under a new version adds events with new ids beside the old ones (ClickHouse keeps both,
`reward_version` tells them apart).

Roles: `rules` now. The assembler, the judge and the trainer need their inputs filtered by version
first (the live assembler must not take a replay's rule rewards), which is the rest of issue #17;
asking for them is an error that says so. This module owns the plan (offsets, group names), the lag
and the run loop; the worker itself is `agentstream worker` in a child process (infra.supervisor).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from infra.errors import InfraError
from schemas import topics

log = logging.getLogger(__name__)

# The topics each role consumes (the faust agents' sources), whose progress measures a replay.
SOURCES: dict[str, tuple[str, ...]] = {"rules": (topics.AGENT_EVENTS,)}
NOT_YET = {
    "assembler": "the assembler does not yet keep one assembly per rule version",
    "judge": "the judge's cache is not yet shared with a replay",
    "trainer": "the trainer does not yet select trajectories by reward version",
}


class ReplayError(InfraError):
    """A replay that cannot run: an unknown role, a bad version or time, a failed worker."""


@dataclass(frozen=True)
class ReplayPlan:
    """What one replay reads: per role its group, and per source partition where it starts and
    the end offset (read at the start) it must reach."""

    roles: tuple[str, ...]
    reward_version: str
    app_prefix: str
    starts: dict[tuple[str, int], int] = field(default_factory=dict)  # (topic, partition) -> offset
    ends: dict[tuple[str, int], int] = field(default_factory=dict)

    def group(self, role: str) -> str:
        return f"{self.app_prefix}-{role}"

    @property
    def total(self) -> int:
        """Records to read per role (summed over its source partitions)."""
        return sum(max(0, self.ends[tp] - self.starts.get(tp, 0)) for tp in self.ends)


def check_roles(roles: tuple[str, ...]) -> tuple[str, ...]:
    """The roles, checked: known and replayable now.

    >>> check_roles(("rules",))
    ('rules',)
    """
    for role in roles:
        if role in NOT_YET:
            raise ReplayError(f"--roles: replaying {role!r} is not supported yet: {NOT_YET[role]}")
        if role not in SOURCES:
            raise ReplayError(f"--roles: unknown role {role!r} (replayable: {', '.join(SOURCES)})")
    if not roles:
        raise ReplayError("--roles: name at least one role (replayable: rules)")
    return roles


def app_prefix(reward_version: str, now: datetime | None = None) -> str:
    """The replay's app-id prefix: version and start time, so every run has fresh groups and state.

    >>> app_prefix("rules-2", datetime(2026, 11, 25, 23, 1, 2, tzinfo=UTC))
    'agentstream-replay-rules-2-20261125T230102'
    """
    if not reward_version or not all(c.isalnum() or c in "-_." for c in reward_version):
        raise ReplayError(
            f"--reward-version: expected letters, digits, '-', '_' or '.', got {reward_version!r}"
        )
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S")
    return f"agentstream-replay-{reward_version}-{stamp}"


def make_plan(
    bootstrap: str, roles: tuple[str, ...], reward_version: str, since: datetime | None = None
) -> ReplayPlan:
    """Read the source partitions' end offsets (and, with `since`, the first offset at or after it)."""
    from kafka import KafkaConsumer, TopicPartition

    roles = check_roles(roles)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="agentstream-replay")
    try:
        partitions = [
            TopicPartition(topic, p)
            for topic in sorted({t for role in roles for t in SOURCES[role]})
            for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        if not partitions:
            raise ReplayError(f"no source partitions on {bootstrap} (topics {SOURCES[roles[0]]})")
        ends = {(tp.topic, tp.partition): n for tp, n in consumer.end_offsets(partitions).items()}
        starts = {(tp.topic, tp.partition): n for tp, n in consumer.beginning_offsets(partitions).items()}
        if since is not None:
            found = consumer.offsets_for_times({tp: int(since.timestamp() * 1000) for tp in partitions})
            for tp, hit in found.items():
                key = (tp.topic, tp.partition)
                starts[key] = ends[key] if hit is None else hit.offset
    finally:
        consumer.close()
    return ReplayPlan(roles, reward_version, app_prefix(reward_version), starts, ends)


def commit_starts(bootstrap: str, plan: ReplayPlan) -> None:
    """Commit each role's start offsets for its new group, so its worker begins there (a new group
    with nothing committed would start at the beginning)."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    for role in plan.roles:
        offsets = {
            TopicPartition(t, p): OffsetAndMetadata(plan.starts.get((t, p), 0), "", -1)
            for (t, p) in plan.ends
            if t in SOURCES[role]
        }
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, group_id=plan.group(role), enable_auto_commit=False
        )
        try:
            consumer.commit(offsets)
        finally:
            consumer.close()


def remaining(committed: dict[tuple[str, int], int], plan: ReplayPlan, role: str) -> int:
    """Records of `role`'s sources still to read: end minus the committed (or start) offset.

    >>> plan = ReplayPlan(("rules",), "v", "p", {("agent.events", 0): 2}, {("agent.events", 0): 10})
    >>> remaining({}, plan, "rules"), remaining({("agent.events", 0): 7}, plan, "rules")
    (8, 3)
    """
    return sum(
        max(0, end - max(committed.get(tp, 0), plan.starts.get(tp, 0)))
        for tp, end in plan.ends.items()
        if tp[0] in SOURCES[role]
    )


def committed_offsets(admin, group: str) -> dict[tuple[str, int], int]:
    found = admin.list_group_offsets(group).get(group, {})
    return {(tp.topic, tp.partition): meta.offset for tp, meta in found.items() if meta.offset >= 0}


@dataclass(frozen=True)
class Progress:
    role: str
    done: int
    total: int
    lag: int
    rate: float  # records/s since the replay started


def follow(
    bootstrap: str,
    plan: ReplayPlan,
    alive: Callable[[], bool],
    on_progress: Callable[[Progress], None],
    interval_s: float = 1.0,
    timeout_s: float | None = None,
) -> None:
    """Poll the groups' committed offsets until every role is caught up with the plan's ends.
    `alive()` False (the worker exited for good) or the timeout raise `ReplayError`."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="agentstream-replay")
    started = time.monotonic()
    try:
        while True:
            lags = {
                role: remaining(committed_offsets(admin, plan.group(role)), plan, role) for role in plan.roles
            }
            elapsed = max(1e-6, time.monotonic() - started)
            for role, lag in lags.items():
                on_progress(Progress(role, plan.total - lag, plan.total, lag, (plan.total - lag) / elapsed))
            if not any(lags.values()):
                return
            if not alive():
                raise ReplayError("the replay worker exited before catching up (see its log above)")
            if timeout_s is not None and elapsed > timeout_s:
                raise ReplayError(f"not caught up after {timeout_s:.0f}s (lag {sum(lags.values())})")
            time.sleep(interval_s)
    finally:
        admin.close()

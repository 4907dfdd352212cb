"""`agentstream replay`: recompute derived topics from the log under a reward version (issue #17).

A replay runs each stream role as a worker of its own consumer group, `agentstream-replay-<version>-
<run>-<role>` (a fresh group and fresh state each run), from the beginning of its source topics or
from the first record at or after `--since`, and writes to the same derived topics as the live role.
It stops once the groups have committed every source partition up to the end offsets read when the
replay started (records published later are the live roles' business), printing progress and lag.

Why the results can be compared: a derived event's id is a function of its input and its version
(a rule reward: `derived_event_id("reward.rule.step", source_event_id, reward_version)`; the judge:
the target, its source event, prompt version, model, mode and rubrics; a trajectory: its id,
revision and content, which holds `reward_version` = `assembly-1+<rule version>`), so a replay under
the same version re-publishes events with the same ids, which every store drops by `event_id`, and a
replay under a new version adds events with new ids beside the old ones.

Roles (`SOURCES`): `judge` (its reply cache and budget are the live judge's: unchanged inputs cost
nothing), `scoring` (rule rewards under the replay's version and the trajectories assembled from
them; it joins the rule rewards it makes itself and never reads `reward.rule`, so replays and the
live stack never take each other's), `batch` (the batch builder, `agentstream batch`, under the
replay's group, taking only trajectories of the version; a batch's id is its kind and trajectory ids,
so a batch cut the same way is the same batch; `trainer` is its old name, `RENAMED_ROLES`). They run
in phases (`PHASES`): the judge first, then scoring, then the batch builder; a phase's derived
sources (`UPSTREAM`: reward.judge, trajectory.scored) are measured again once the roles writing them
are done, so it reads everything the replay made. A role's own internal topics (`INTERNAL`: the
judge's group-mode forwards) are measured once its sources are caught up.
Roles of earlier releases (`streams.config.MERGED_ROLES`) are refused saying what replaces them.

This module owns the plan (offsets, group names), the lag and the wait; the workers themselves are
`agentstream worker` / `agentstream batch` in child processes (infra.supervisor, run by
infra/commands/replay.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from infra.errors import InfraError
from schemas import topics
from streams.config import check_roles as check_stream_roles
from streams.errors import WorkerConfigError

log = logging.getLogger(__name__)

CLIENT_ID = "agentstream-replay"

# The topics each role consumes (the faust agents' sources), whose progress measures a replay.
SOURCES: dict[str, tuple[str, ...]] = {
    "judge": (topics.AGENT_EVENTS,),
    "scoring": (topics.AGENT_EVENTS, topics.REWARD_JUDGE, topics.FEEDBACK_HUMAN),
    "batch": (topics.TRAJECTORY_SCORED,),
}
# Sources that replayed roles write to while the replay runs: source -> the role writing it.
UPSTREAM: dict[str, dict[str, str]] = {
    "scoring": {topics.REWARD_JUDGE: "judge"},
    "batch": {topics.TRAJECTORY_SCORED: "scoring"},
}
# A role's own topics, `<its app id>-<suffix>` (streams/shell.py `internal_topic`), that it reads too.
INTERNAL: dict[str, tuple[str, ...]] = {"judge": ("judge-groups",)}
# Roles of a phase run together; a phase starts when the one before it is caught up.
PHASES: tuple[tuple[str, ...], ...] = (("judge",), ("scoring",), ("batch",))
# Old role names, still accepted (with a note) for one release: old -> new.
RENAMED_ROLES: dict[str, str] = {"trainer": "batch"}


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

    def topics(self, role: str) -> tuple[str, ...]:
        """What `role` reads: its sources and its own internal topics.

        >>> ReplayPlan(("judge",), "v", "p").topics("judge")
        ('agent.events', 'p-judge-judge-groups')
        """
        return SOURCES[role] + tuple(f"{self.group(role)}-{s}" for s in INTERNAL.get(role, ()))

    @property
    def total(self) -> int:
        """Records to read (summed over every source partition of the replay's roles)."""
        return sum(max(0, self.ends[tp] - self.starts.get(tp, 0)) for tp in self.ends)

    def total_for(self, role: str) -> int:
        """Records `role` has to read (summed over its partitions known so far)."""
        mine = self.topics(role)
        return sum(max(0, end - self.starts.get(tp, 0)) for tp, end in self.ends.items() if tp[0] in mine)

    def with_ends(self, ends: dict[tuple[str, int], int]) -> ReplayPlan:
        """The plan with later end offsets for some partitions (never earlier ones)."""
        merged = dict(self.ends)
        for tp, end in ends.items():
            merged[tp] = max(end, merged.get(tp, 0))
        return replace(self, ends=merged)


def phases(roles: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The replay's roles in the order they run (`PHASES`), empty phases left out.

    >>> phases(("batch", "scoring", "judge")), phases(("scoring",))
    ([('judge',), ('scoring',), ('batch',)], [('scoring',)])
    """
    ordered = [tuple(r for r in phase if r in roles) for phase in PHASES]
    return [phase for phase in ordered if phase]


def upstream_topics(plan: ReplayPlan, role: str, done: tuple[str, ...]) -> tuple[str, ...]:
    """`role`'s sources written by replayed roles in `done`: their ends are read again before it runs.

    >>> plan = ReplayPlan(("judge", "scoring"), "v", "p")
    >>> upstream_topics(plan, "scoring", ("judge",)), upstream_topics(plan, "scoring", ())
    (('reward.judge',), ())
    """
    return tuple(topic for topic, writer in UPSTREAM.get(role, {}).items() if writer in done)


def check_roles(roles: tuple[str, ...]) -> tuple[str, ...]:
    """The roles, checked: known and replayable now (the stream roles' check, with `SOURCES`).

    >>> check_roles(("scoring", "batch"))
    ('scoring', 'batch')
    """
    try:
        return check_stream_roles(roles, tuple(SOURCES), listed="replayable")
    except WorkerConfigError as refused:
        raise ReplayError(str(refused)) from None


def current_roles(roles: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    """The roles with old names replaced by their new ones (`RENAMED_ROLES`), and a note per old name.

    >>> roles, notes = current_roles(("scoring", "trainer"))
    >>> roles, notes[0][:50]
    (('scoring', 'batch'), 'agentstream: replay role `trainer` is now `batch`;')
    """
    notes = [
        f"agentstream: replay role `{r}` is now `{RENAMED_ROLES[r]}`; the old name goes in the next release"
        for r in dict.fromkeys(roles)
        if r in RENAMED_ROLES
    ]
    return tuple(RENAMED_ROLES.get(r, r) for r in roles), notes


def check_judge() -> None:
    """A judge replay needs the judge on (an API key in the environment): a judge worker without
    one subscribes to nothing, and the replay would wait for it forever."""
    from streams.judge.config import read_config

    config = read_config()
    if not config.enabled:
        raise ReplayError(
            f"--roles judge: the judge is off without an API key (AGENTSTREAM_JUDGE_API_KEY or "
            f"{config.key_variable} for provider {config.provider!r}); set the live judge's settings"
        )


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
    from clients.kafka import ensure_topics, make_consumer
    from clients.kafka.ranges import topic_partitions

    roles = check_roles(roles)
    ensure_topics(bootstrap)  # a source no one wrote yet (reward.judge without a judge) is empty, not absent
    consumer = make_consumer(bootstrap, CLIENT_ID)
    try:
        partitions = topic_partitions(consumer, sorted({t for role in roles for t in SOURCES[role]}))
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


def read_ends(bootstrap: str, names: tuple[str, ...]) -> dict[tuple[str, int], int]:
    """The end offsets of the topics' partitions now (a topic that does not exist has none)."""
    from clients.kafka import make_consumer
    from clients.kafka.ranges import topic_partitions

    if not names:
        return {}
    consumer = make_consumer(bootstrap, CLIENT_ID)
    try:
        partitions = topic_partitions(consumer, sorted(names))
        found = consumer.end_offsets(partitions) if partitions else {}
        return {(tp.topic, tp.partition): n for tp, n in found.items()}
    finally:
        consumer.close()


def commit_starts(bootstrap: str, plan: ReplayPlan) -> None:
    """Commit each role's start offsets for its new group, so its worker begins there (a new group
    with nothing committed would start at the beginning)."""
    from clients.kafka.groups import commit_group_offsets

    for role in plan.roles:
        offsets = {(t, p): plan.starts.get((t, p), 0) for (t, p) in plan.ends if t in SOURCES[role]}
        commit_group_offsets(bootstrap, plan.group(role), offsets)


def remaining(committed: dict[tuple[str, int], int], plan: ReplayPlan, role: str) -> int:
    """Records of `role`'s topics still to read: end minus the committed (or start) offset.

    >>> plan = ReplayPlan(("scoring",), "v", "p", {("agent.events", 0): 2}, {("agent.events", 0): 10})
    >>> remaining({}, plan, "scoring"), remaining({("agent.events", 0): 7}, plan, "scoring")
    (8, 3)
    """
    mine = plan.topics(role)
    return sum(
        max(0, end - max(committed.get(tp, 0), plan.starts.get(tp, 0)))
        for tp, end in plan.ends.items()
        if tp[0] in mine
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
    rate: float  # records/s since the phase started


def follow(
    bootstrap: str,
    plan: ReplayPlan,
    roles: tuple[str, ...],
    alive: Callable[[], bool],
    on_progress: Callable[[Progress], None],
    interval_s: float = 1.0,
    deadline: float | None = None,
) -> ReplayPlan:
    """Poll the groups' committed offsets until every role in `roles` is caught up with the plan's
    ends. Once a role's sources are caught up, the ends of its internal topics (`INTERNAL`) are read
    and it must reach those too; the plan returned holds them. `alive()` False (a worker exited for
    good) or passing `deadline` (time.monotonic()) raise `ReplayError`."""
    from clients.kafka import make_admin

    admin = make_admin(bootstrap, CLIENT_ID)
    started = time.monotonic()
    unmeasured = {role for role in roles if INTERNAL.get(role)}  # internal topics not measured yet
    try:
        while True:
            lags = {role: remaining(committed_offsets(admin, plan.group(role)), plan, role) for role in roles}
            for role in [r for r in unmeasured if not lags[r]]:
                unmeasured.discard(role)
                plan = plan.with_ends(read_ends(bootstrap, plan.topics(role)[len(SOURCES[role]) :]))
                lags[role] = remaining(committed_offsets(admin, plan.group(role)), plan, role)
            elapsed = max(1e-6, time.monotonic() - started)
            for role, lag in lags.items():
                total = plan.total_for(role)
                on_progress(Progress(role, total - lag, total, lag, (total - lag) / elapsed))
            if not any(lags.values()) and not unmeasured:
                return plan
            if not alive():
                raise ReplayError("a replay worker exited before catching up (see its log above)")
            if deadline is not None and time.monotonic() > deadline:
                raise ReplayError(f"not caught up before the timeout (lag {sum(lags.values())})")
            time.sleep(interval_s)
    finally:
        admin.close()


def linger(seconds: float, alive: Callable[[], bool], deadline: float | None = None) -> None:
    """Keep the workers running `seconds` more (scoring's grace period: what is still
    incomplete is emitted then); a worker that exits or passing `deadline` raise `ReplayError`."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if not alive():
            raise ReplayError("a replay worker exited during the grace period (see its log above)")
        if deadline is not None and time.monotonic() > deadline:
            raise ReplayError("the timeout passed during scoring's grace period")
        time.sleep(min(0.5, max(0.0, until - time.monotonic())))

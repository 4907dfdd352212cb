"""The batching state machine between the Kafka shell and the builders (pure: time is passed in).

One lane per batch kind. A lane admits a trajectory when it is complete, eligible for that kind, not
already in a committed batch of that kind, and not a content duplicate of another trajectory; a
later revision replaces a pending earlier one (or withdraws it when no longer eligible). Plain lanes
(SFT) batch trajectories directly; group lanes (DPO, step DPO, GRPO) first gather groups of one task.
A lane flushes when `batch_trajectories` are ready or the oldest ready one waited `flush_interval_s`.

One reward definition per group (docs/reward-definitions.md): a DPO pair or a GRPO group compares
rewards, so its members must have been scored the same way (`TrajectoryScored.definition()`, e.g.
`rules+judge@...` vs `rules@...` when the judge failed). A finished group whose members disagree is
held up to `group_definition_wait_s` (later revisions of its members replace them, e.g. a late
judge score), then built from the members of its most common definition (`split_by_definition`);
the others are left out, logged and counted in the batch's `builder_config`
(`left_out_by_definition`, with `reward_definitions`). A group left with fewer than
`min_group_size` members is dropped whole (counted too). A kind's own counts since the previous
batch (`BatchKind.report`, e.g. GRPO's `left_out_by_tokenizer`) go in the same place.

Evaluation never trains (schema 1.5): a trajectory whose `purpose` is not "train" (`agentstream eval`
marks its episodes "eval"), or whose purpose is unknown because its `episode.started` never arrived
(an incomplete emission under `--no-require-complete`), is offered to no lane and withdrawn from any
lane holding an earlier revision; each lane counts them in its next batch's `builder_config`
(`left_out_by_purpose`) and the planner keeps the running total (`left_out_by_purpose`).

`commit_positions` gives, per partition, the offset that is safe to commit: the lowest offset still
pending in any lane, or everything consumed when nothing is pending there. After a crash, replay from
there rebuilds the pending state, and trajectories already in a manifest are skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from consumers.batching.builders.common import sorted_versions
from consumers.batching.builders.dedup import content_hash
from consumers.batching.builders.groups import Group, GroupCollector, Member
from consumers.batching.config import PlannerConfig
from consumers.batching.kinds import KINDS, BatchContext, Resources
from schemas.events import PolicyUpdated, TrajectoryScored
from schemas.policy_versions import newer
from schemas.records import Record
from schemas.versions import reward_version_matches

log = logging.getLogger(__name__)

Partition = tuple[str, int]

__all__ = ["Entry", "GroupLane", "Lane", "PlannedBatch", "Planner", "split_by_definition"]


def _layer_count(definition: str) -> int:
    return len(definition.split("@", 1)[0].split("+"))


def split_by_definition(definitions: list[str]) -> tuple[str, list[int], list[int]]:
    """(the definition most members share, indices kept, indices left out). Ties go to the
    definition with more layers, then to the smaller id, so the choice does not depend on order.

    >>> split_by_definition(["rules+judge@v", "rules@v", "rules+judge@v"])
    ('rules+judge@v', [0, 2], [1])
    >>> split_by_definition(["rules@v", "rules+judge@v"])[0]
    'rules+judge@v'
    """
    counts: dict[str, int] = {}
    for d in definitions:
        counts[d] = counts.get(d, 0) + 1
    best = min(counts, key=lambda d: (-counts[d], -_layer_count(d), d))
    kept = [i for i, d in enumerate(definitions) if d == best]
    return best, kept, [i for i, d in enumerate(definitions) if d != best]


@dataclass
class Held:
    """A finished group whose members disagree on the reward definition, held since `since`."""

    group: Group[Entry]
    since: float


@dataclass
class Entry:
    trajectory: TrajectoryScored
    source: Record
    digest: str


def source_ranges(entries: list[Entry]) -> dict[str, dict[str, list[int]]]:
    """topic -> partition -> [first, last] offset of the entries' records."""
    ranges: dict[str, dict[str, list[int]]] = {}
    for e in entries:
        part = ranges.setdefault(e.source.topic, {})
        key, offset = str(e.source.partition), e.source.offset
        first, last = part.get(key, [offset, offset])
        part[key] = [min(first, offset), max(last, offset)]
    return ranges


@dataclass
class PlannedBatch:
    kind: str
    rows: list[dict[str, Any]]
    entries: list[Entry]
    builder_config: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    groups: list[Group[Entry]] = field(default_factory=list)
    """The groups the rows were built from (grouped kinds; none for a plain lane)."""

    def meta(self) -> dict[str, Any]:
        """Manifest fields (see batch_writer.BatchManifest)."""
        offsets: dict[str, dict[str, int]] = {}
        for e in self.entries:
            part = offsets.setdefault(e.source.topic, {})
            part[str(e.source.partition)] = max(part.get(str(e.source.partition), 0), e.source.offset + 1)
        ts = [e.trajectory for e in self.entries]
        return {
            "trajectory_ids": [t.trajectory_id for t in ts],
            "content_hashes": [e.digest for e in self.entries],
            "source_offsets": offsets,
            "source_ranges": source_ranges(self.entries),
            "reward_versions": sorted_versions({t.reward_version for t in ts}),
            "calibration_versions": sorted_versions({t.calibration_version for t in ts}),
            "policy_versions": sorted_versions({t.policy_version for t in ts}),
            "builder_config": self.builder_config,
            "extra": self.extra,
        }


class Lane:
    """A plain lane: eligible trajectories wait here until the batch flushes."""

    def __init__(self, kind: str, planner: Planner):
        self.kind, self.planner = kind, planner
        self.spec = KINDS[kind]
        self.builder = planner.builders[kind]
        self.ready: dict[str, Entry] = {}
        self.ready_since: float | None = None
        self.done: set[str] = set()
        self.hashes: dict[str, str] = {}
        self.left_out_by_purpose = 0  # trajectories not for training since the last batch

    def eligible(self, t: TrajectoryScored) -> bool:
        return self.spec.eligible(self.builder, t, self.planner.context())

    def pending_entries(self) -> list[Entry]:
        return list(self.ready.values())

    def offer(self, entry: Entry, now: float) -> None:
        t = entry.trajectory
        if t.trajectory_id in self.done:
            return
        if not self._fresher(t):
            return
        self.withdraw(t.trajectory_id)
        if not self.eligible(t) or self._duplicate(entry):
            return
        self.hashes[entry.digest] = t.trajectory_id
        self.admit(entry, now)

    def _fresher(self, t: TrajectoryScored) -> bool:
        current = self.pending_revision(t.trajectory_id)
        return current is None or t.revision >= current

    def _duplicate(self, entry: Entry) -> bool:
        owner = self.hashes.get(entry.digest)
        return self.planner.config.dedup and owner is not None and owner != entry.trajectory.trajectory_id

    def pending_revision(self, trajectory_id: str) -> int | None:
        entry = self.ready.get(trajectory_id)
        return entry.trajectory.revision if entry else None

    def withdraw(self, trajectory_id: str) -> None:
        entry = self.ready.pop(trajectory_id, None)
        if entry is not None:
            self.hashes.pop(entry.digest, None)

    def admit(self, entry: Entry, now: float) -> None:
        self.ready[entry.trajectory.trajectory_id] = entry
        if self.ready_since is None:
            self.ready_since = now

    def due(self, now: float, force: bool = False) -> list[PlannedBatch]:
        size = self.planner.config.batch_trajectories
        waited = (
            self.ready_since is not None and now - self.ready_since >= self.planner.config.flush_interval_s
        )
        if not self.ready or not (force or waited or len(self.ready) >= size):
            return []
        entries = list(self.ready.values())[:size]
        for e in entries:
            del self.ready[e.trajectory.trajectory_id]
        self.ready_since = now if self.ready else None
        return [self.batch(entries)]

    def batch(self, entries: list[Entry]) -> PlannedBatch:
        trajectories = [e.trajectory for e in entries]
        rows = self.spec.rows(self.builder, trajectories, self.planner.context())
        settings = self.spec.settings(self.planner.config) | self.spec.report(self.builder)
        return PlannedBatch(self.kind, rows, entries, settings | self.take_purpose_count())

    def not_for_training(self, trajectory_id: str) -> None:
        """A trajectory of another purpose than training: withdraw any earlier revision, count it."""
        self.withdraw(trajectory_id)
        self.left_out_by_purpose += 1

    def take_purpose_count(self) -> dict[str, int]:
        """The count for the next batch's `builder_config`, reset."""
        count, self.left_out_by_purpose = self.left_out_by_purpose, 0
        return {"left_out_by_purpose": count}

    def committed(self, batch: PlannedBatch) -> None:
        self.done.update(e.trajectory.trajectory_id for e in batch.entries)


def _step_event_ids(t: TrajectoryScored) -> list[str | None]:
    return [s.event_id for s in t.steps]


class GroupLane(Lane):
    """A lane that first gathers groups of one task (DPO pairs, GRPO advantages need siblings)."""

    def __init__(self, kind: str, planner: Planner):
        super().__init__(kind, planner)
        self.collector: GroupCollector[Entry] = planner.config.groups.collector()
        self.groups: list[Group[Entry]] = []
        self.index: dict[str, Entry] = {}  # trajectory id -> pending entry (in a collector group)
        self.grouped: set[str] = set()  # trajectory ids in finished groups waiting for the flush
        self.held: list[Held] = []  # finished groups of mixed reward definitions, waiting to agree
        self.left_out = 0  # members left out for their reward definition since the last batch

    def key(self, t: TrajectoryScored) -> tuple[str, ...]:
        return self.spec.group_key(t)

    def _duplicate(self, entry: Entry) -> bool:
        """A content copy, unless both are draws of their own: two episodes that came out the same
        but were recorded apart (different step event ids) both count, as GRPO's baseline needs every
        draw; dropping them held such a group back until its timeout, then trained it incomplete."""
        if not super()._duplicate(entry):
            return False
        owner = self.index.get(self.hashes[entry.digest])
        return owner is None or _step_event_ids(owner.trajectory) == _step_event_ids(entry.trajectory)

    def pending_entries(self) -> list[Entry]:
        groups = self.groups + [h.group for h in self.held]
        return self.collector.items() + [m.item for g in groups for m in g.members]

    def pending_revision(self, trajectory_id: str) -> int | None:
        entry = self.index.get(trajectory_id)
        return entry.trajectory.revision if entry else None

    def withdraw(self, trajectory_id: str) -> None:
        if trajectory_id in self.grouped:
            return  # already in a finished group: that group's revision stands
        entry = self.index.pop(trajectory_id, None)
        if entry is not None:
            self.hashes.pop(entry.digest, None)
            self.collector.discard(trajectory_id)

    def admit(self, entry: Entry, now: float) -> None:
        if entry.trajectory.trajectory_id in self.grouped:
            self._revise_held(entry, now)
            return
        self.index[entry.trajectory.trajectory_id] = entry
        for group in self.collector.add(self.key(entry.trajectory), entry.trajectory, entry, now):
            self._ready(group, now)

    def _ready(self, group: Group[Entry], now: float) -> None:
        self.grouped.update(m.trajectory.trajectory_id for m in group.members)
        if len(_definitions(group)) > 1 and self.planner.config.group_definition_wait_s > 0:
            self.held.append(Held(group, now))
            return
        self._finish(group, now)

    def _revise_held(self, entry: Entry, now: float) -> None:
        """A later revision of a member of a held group replaces it; the group goes on once its
        members agree on the reward definition."""
        t = entry.trajectory
        for held in self.held:
            for i, m in enumerate(held.group.members):
                if m.trajectory.trajectory_id == t.trajectory_id and t.revision >= m.trajectory.revision:
                    held.group.members[i] = Member(t, entry)
                    self.index[t.trajectory_id] = entry
                    if len(_definitions(held.group)) == 1:
                        self.held.remove(held)
                        self._finish(held.group, now)
                    return

    def _release_held(self, now: float, force: bool) -> None:
        wait = self.planner.config.group_definition_wait_s
        for held in [h for h in self.held if force or now - h.since >= wait]:
            self.held.remove(held)
            self._finish(held.group, now)

    def _finish(self, group: Group[Entry], now: float) -> None:
        """Keep the members of the group's most common reward definition; count and log the rest."""
        best, kept, out = split_by_definition([m.trajectory.definition() for m in group.members])
        if out and len(kept) < self.planner.config.groups.min_group_size:
            kept, out = [], list(range(len(group.members)))
        dropped = [group.members[i] for i in out]
        if dropped:
            self.left_out += len(dropped)
            log.info(
                "%s: group %s: %d of %d members left out for their reward definition (kept %s: %d)",
                self.kind, group.key, len(dropped), len(group.members), best, len(kept),
            )  # fmt: skip
            for m in dropped:
                tid = m.trajectory.trajectory_id
                self.grouped.discard(tid)
                self.index.pop(tid, None)
                self.hashes.pop(m.item.digest, None)
            group.members = [group.members[i] for i in kept]
            group.complete = False  # it did not reach its size under one definition
        if not group.members:
            return
        self.groups.append(group)
        if self.ready_since is None:
            self.ready_since = now

    def due(self, now: float, force: bool = False) -> list[PlannedBatch]:
        for group in self.collector.expire(now):
            log.info(
                "%s: group %s timed out with %d members (emitted incomplete)",
                self.kind,
                group.key,
                len(group.members),
            )
            self._ready(group, now)
        self._release_held(now, force)
        count = sum(len(g.members) for g in self.groups)
        waited = (
            self.ready_since is not None and now - self.ready_since >= self.planner.config.flush_interval_s
        )
        if not self.groups or not (force or waited or count >= self.planner.config.batch_trajectories):
            return []
        groups, self.groups, self.ready_since = self.groups, [], None
        for g in groups:
            for m in g.members:
                self.grouped.discard(m.trajectory.trajectory_id)
                self.index.pop(m.trajectory.trajectory_id, None)
        return [self.group_batch(groups)]

    def group_batch(self, groups: list[Group[Entry]]) -> PlannedBatch:
        rows: list[dict[str, Any]] = []
        for g in groups:
            rows += self.rows(g)
        entries = [m.item for g in groups for m in g.members]
        definitions = (
            {
                "reward_definitions": sorted({m.trajectory.definition() for g in groups for m in g.members}),
                "left_out_by_definition": self.left_out,
            }
            | self.spec.report(self.builder)
            | self.take_purpose_count()
        )  # e.g. GRPO's tokenizer count
        self.left_out = 0
        extra = {
            "groups": len(groups),
            "incomplete_groups": sum(1 for g in groups if not g.complete),
            "training_step": self.planner.training_step,
            "current_policy": self.planner.current_policy,
        } | definitions
        settings = self.spec.settings(self.planner.config) | definitions
        return PlannedBatch(self.kind, rows, entries, settings, extra, groups)

    def rows(self, group: Group[Entry]) -> list[dict[str, Any]]:
        context = replace(self.planner.context(), complete=group.complete)
        return self.spec.rows(self.builder, group.trajectories, context)


def for_training(trajectory: TrajectoryScored) -> bool:
    """Whether batches may be built from `trajectory`: its purpose is "train" and known (its
    `episode.started` arrived; without it the purpose is the default, not the producer's word).

    >>> from datetime import UTC, datetime
    >>> t = TrajectoryScored(event_id="e", trajectory_id="t", occurred_at=datetime.now(UTC), producer="p",
    ...                      task_id="x")
    >>> for_training(t), for_training(t.model_copy(update={"purpose": "eval"}))
    (True, False)
    >>> for_training(t.model_copy(update={"missing": ["episode.started"]}))
    False
    """
    return trajectory.purpose == "train" and "episode.started" not in trajectory.missing


def _definitions(group: Group[Entry]) -> set[str]:
    return {m.trajectory.definition() for m in group.members}


class Planner:
    """Routes trajectories to lanes; knows the current policy for staleness and horizon schedules."""

    def __init__(
        self,
        config: PlannerConfig,
        known_ids: dict[str, set[str]] | None = None,
        known_hashes: dict[str, dict[str, str]] | None = None,
        tokenizer: Any = None,
        base_tokenizer_hash: Callable[[], str] | None = None,
    ):
        needing = [k for k in config.kinds if KINDS[k].needs_tokenizer]
        if needing and tokenizer is None:
            raise ValueError(f"kinds: {needing[0]!r} needs a tokenizer (got None)")
        self.config = config
        self.tokenizer = tokenizer
        resources = Resources(tokenizer, base_tokenizer_hash)
        self.builders = {kind: KINDS[kind].make(config, resources) for kind in config.kinds}
        self.current_update: PolicyUpdated | None = None  # the current policy (schemas.policy_versions)
        self.lanes: dict[str, Lane] = {kind: self._lane(kind) for kind in config.kinds}
        self.other_versions: dict[str, int] = {}  # reward version -> trajectories skipped for it
        self.left_out_by_purpose = 0  # trajectories not for training (evaluation), since start
        for kind, lane in self.lanes.items():
            lane.done = set((known_ids or {}).get(kind, ()))
            lane.hashes = dict((known_hashes or {}).get(kind, {}))

    def context(self) -> BatchContext:
        """What builders may need beyond trajectories: the newest policy and training step."""
        return BatchContext(training_step=self.training_step, current_policy=self.current_policy)

    def _lane(self, kind: str) -> Lane:
        return GroupLane(kind, self) if KINDS[kind].grouped else Lane(kind, self)

    def selects(self, trajectory: TrajectoryScored) -> bool:
        """Whether `trajectory` is of the selected `reward_version` (an unversioned one, written
        before versions existed, is taken under any selection)."""
        selected, stamped = self.config.reward_version, trajectory.reward_version
        return selected == "any" or not stamped or reward_version_matches(stamped, selected)

    def offer(self, trajectory: TrajectoryScored, source: Record, now: float) -> None:
        if not self.selects(trajectory):
            skipped = self.other_versions.get(trajectory.reward_version, 0)
            if not skipped:
                log.info(
                    "trainer: skipping trajectories of reward version %s (selected: %s), first %s[%d]@%d",
                    trajectory.reward_version, self.config.reward_version,
                    source.topic, source.partition, source.offset,
                )  # fmt: skip
            self.other_versions[trajectory.reward_version] = skipped + 1
            return
        if not for_training(trajectory):
            self._leave_out(trajectory, source)
            return
        if self.config.require_complete and not trajectory.complete:
            return
        entry = Entry(trajectory, source, content_hash(trajectory))
        for lane in self.lanes.values():
            lane.offer(entry, now)

    def _leave_out(self, trajectory: TrajectoryScored, source: Record) -> None:
        if not self.left_out_by_purpose:
            log.info(
                "trainer: leaving out trajectories not for training (purpose %r), first %s %s[%d]@%d",
                trajectory.purpose, trajectory.trajectory_id, source.topic, source.partition, source.offset,
            )  # fmt: skip
        self.left_out_by_purpose += 1
        for lane in self.lanes.values():
            lane.not_for_training(trajectory.trajectory_id)

    def policy_updated(self, event: PolicyUpdated) -> None:
        """Fold one `policy.updated` into the current policy (by version order, not arrival)."""
        self.current_update = newer(self.current_update, event)

    @property
    def current_policy(self) -> str | None:
        """The current policy's version (GRPO staleness); None before any update."""
        return self.current_update.policy_version if self.current_update is not None else None

    @property
    def training_step(self) -> int:
        """The current policy's training step (recorded in GRPO manifests); 0 before any update."""
        return self.current_update.step if self.current_update is not None else 0

    def due(self, now: float, force: bool = False) -> list[PlannedBatch]:
        return [b for lane in self.lanes.values() for b in lane.due(now, force)]

    def committed(self, batch: PlannedBatch) -> None:
        self.lanes[batch.kind].committed(batch)

    def commit_positions(self, consumed: dict[Partition, int]) -> dict[Partition, int]:
        """Per partition: the lowest pending offset, or the consumed position when nothing is pending."""
        positions = dict(consumed)
        for lane in self.lanes.values():
            for e in lane.pending_entries():
                tp = (e.source.topic, e.source.partition)
                if tp in positions:
                    positions[tp] = min(positions[tp], e.source.offset)
        return positions

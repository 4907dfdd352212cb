"""The batching state machine between the Kafka shell and the builders (pure: time is passed in).

One lane per batch kind. A lane admits a trajectory when it is complete, eligible for that kind, not
already in a committed batch of that kind, and not a content duplicate of another trajectory; a
later revision replaces a pending earlier one (or withdraws it when no longer eligible). Plain lanes
(SFT) batch trajectories directly; group lanes (DPO, step DPO, GRPO) first gather groups of one task.
A lane flushes when `batch_trajectories` are ready or the oldest ready one waited `flush_interval_s`.

`commit_positions` gives, per partition, the offset that is safe to commit: the lowest offset still
pending in any lane, or everything consumed when nothing is pending there. After a crash, replay from
there rebuilds the pending state, and trajectories already in a manifest are skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from consumers.trainer.builders.common import sorted_versions
from consumers.trainer.builders.dedup import content_hash
from consumers.trainer.builders.groups import Group, GroupCollector
from consumers.trainer.config import PlannerConfig
from consumers.trainer.kinds import KINDS, BatchContext
from schemas.events import TrajectoryScored
from schemas.records import Record

log = logging.getLogger(__name__)

Partition = tuple[str, int]

__all__ = ["Entry", "GroupLane", "Lane", "PlannedBatch", "Planner", "PlannerConfig"]


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
        return PlannedBatch(self.kind, rows, entries, self.spec.settings(self.planner.config))

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
        return self.collector.items() + [m.item for g in self.groups for m in g.members]

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
            return
        self.index[entry.trajectory.trajectory_id] = entry
        for group in self.collector.add(self.key(entry.trajectory), entry.trajectory, entry, now):
            self._ready(group, now)

    def _ready(self, group: Group[Entry], now: float) -> None:
        self.grouped.update(m.trajectory.trajectory_id for m in group.members)
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
        extra = {
            "groups": len(groups),
            "incomplete_groups": sum(1 for g in groups if not g.complete),
            "training_step": self.planner.training_step,
            "current_policy": self.planner.current_policy,
        }
        return PlannedBatch(self.kind, rows, entries, self.spec.settings(self.planner.config), extra)

    def rows(self, group: Group[Entry]) -> list[dict[str, Any]]:
        context = replace(self.planner.context(), complete=group.complete)
        return self.spec.rows(self.builder, group.trajectories, context)


class Planner:
    """Routes trajectories to lanes; knows the current policy for staleness and horizon schedules."""

    def __init__(
        self,
        config: PlannerConfig,
        known_ids: dict[str, set[str]] | None = None,
        known_hashes: dict[str, dict[str, str]] | None = None,
        tokenizer: Any = None,
    ):
        needing = [k for k in config.kinds if KINDS[k].needs_tokenizer]
        if needing and tokenizer is None:
            raise ValueError(f"kinds: {needing[0]!r} needs a tokenizer (got None)")
        self.config = config
        self.tokenizer = tokenizer
        self.builders = {kind: KINDS[kind].make(config, tokenizer) for kind in config.kinds}
        self.current_policy: str | None = None
        self.training_step = 0
        self.lanes: dict[str, Lane] = {kind: self._lane(kind) for kind in config.kinds}
        for kind, lane in self.lanes.items():
            lane.done = set((known_ids or {}).get(kind, ()))
            lane.hashes = dict((known_hashes or {}).get(kind, {}))

    def context(self) -> BatchContext:
        """What builders may need beyond trajectories: the newest policy and training step."""
        return BatchContext(training_step=self.training_step, current_policy=self.current_policy)

    def _lane(self, kind: str) -> Lane:
        return GroupLane(kind, self) if KINDS[kind].grouped else Lane(kind, self)

    def offer(self, trajectory: TrajectoryScored, source: Record, now: float) -> None:
        if self.config.require_complete and not trajectory.complete:
            return
        entry = Entry(trajectory, source, content_hash(trajectory))
        for lane in self.lanes.values():
            lane.offer(entry, now)

    def policy_updated(self, version: str, step: int) -> None:
        self.current_policy, self.training_step = version, max(self.training_step, step)

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

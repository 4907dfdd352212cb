"""The consumer-group coordinator: membership, rebalances and generations (classic protocol).

States follow Apache Kafka's coordinator: Empty -> PreparingRebalance -> CompletingRebalance ->
Stable (and back), Dead when a group is removed. A rebalance waits until every known member has
rejoined (after a short initial delay for an empty group), or until the largest rebalance timeout
expires, when members that did not rejoin are evicted. The first protocol every member supports is
chosen; the leader computes the assignment and hands it over in SyncGroup, where followers wait for
it. Members that stop heartbeating for their session timeout are evicted and trigger a rebalance.

This module owns in-memory group state only. Committed offsets are stored by the caller (see
handlers_groups.py); nothing here touches the disk or the network. The values it works on
(groups, members, join and sync answers) and their JSON snapshot form are in group_state.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field

from infra.broker.group_state import (
    Group,
    GroupState,
    JoinRequest,
    JoinResult,
    Member,
    SyncResult,
    group_from_record,
    group_record,
)
from infra.broker.protocol import ErrorCode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CoordinatorConfig:
    initial_rebalance_delay_ms: int = field(
        default=100,
        metadata={"help": "how long an empty group waits for more members before its first rebalance"},
    )
    session_check_interval_ms: int = 250
    min_session_timeout_ms: int = 1_000
    max_session_timeout_ms: int = 1_800_000


class GroupCoordinator:
    """All consumer groups of this broker. Every method runs on the broker's event loop."""

    def __init__(self, config: CoordinatorConfig | None = None) -> None:
        self.config = config or CoordinatorConfig()
        self.groups: dict[str, Group] = {}
        self._reaper: asyncio.Task | None = None
        # Called when a group becomes stable or empty, so the broker can persist `snapshot()`.
        self.on_membership_change = None

    # -- durable membership ----------------------------------------------------------------------

    def snapshot(self) -> dict:
        """The stable groups (generation, leader, members and their assignments) as plain JSON data.

        Kafka keeps this in `__consumer_offsets`; restoring it after a broker restart lets consumers
        carry on heartbeating with their generation instead of all rebalancing at once."""
        return {gid: group_record(g) for gid, g in self.groups.items() if g.state is GroupState.STABLE}

    def restore(self, snapshot: dict) -> int:
        """Load `snapshot()` data; members get a fresh session (dead ones expire as usual)."""
        for gid, record in snapshot.items():
            self.groups[gid] = group_from_record(gid, record)
        return len(snapshot)

    def _membership_changed(self) -> None:
        if self.on_membership_change is not None:
            self.on_membership_change()

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._reaper = asyncio.get_running_loop().create_task(self._reap_forever())

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            try:
                await self._reaper
            except asyncio.CancelledError:
                pass

    # -- JoinGroup -------------------------------------------------------------------------------

    async def join(self, request: JoinRequest) -> JoinResult:
        if not request.group_id:
            return JoinResult(ErrorCode.INVALID_GROUP_ID, request.member_id or "")
        group = self.groups.setdefault(request.group_id, Group(request.group_id))
        error = self._join_error(group, request)
        if error is not None:
            return JoinResult(error, request.member_id)
        if not request.member_id:
            member_id = f"{request.client_id}-{uuid.uuid4()}"
            if request.requires_known_member_id:
                group.pending[member_id] = time.monotonic() + request.session_timeout_ms / 1000
                return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id)
            request.member_id = member_id
        group.pending.pop(request.member_id, None)
        rejoining = request.member_id in group.members
        member = self._upsert_member(group, request)
        if rejoining and self._can_answer_from_stable(group, member, request):
            return self._join_result(group, member)
        member.join_future = asyncio.get_running_loop().create_future()
        future = member.join_future
        if group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group, f"member {member.member_id} joined")
        self._maybe_complete_join(group)
        return await future

    def _join_error(self, group: Group, request: JoinRequest) -> int | None:
        cfg = self.config
        if not cfg.min_session_timeout_ms <= request.session_timeout_ms <= cfg.max_session_timeout_ms:
            return ErrorCode.INVALID_SESSION_TIMEOUT
        known = request.member_id in group.members or request.member_id in group.pending
        if request.member_id and not known:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if not request.protocols:
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if group.members and group.protocol_type not in (None, request.protocol_type):
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        others = [m for m in group.members.values() if m.member_id != request.member_id]
        offered = {name for name, _ in request.protocols}
        if others and not offered & set.intersection(*({n for n, _ in m.protocols} for m in others)):
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        return None

    def _upsert_member(self, group: Group, request: JoinRequest) -> Member:
        member = group.members.get(request.member_id)
        if member is None:
            member = Member(
                member_id=request.member_id,
                client_id=request.client_id,
                client_host=request.client_host,
                group_instance_id=request.group_instance_id,
                protocol_type=request.protocol_type,
                protocols=list(request.protocols),
                session_timeout_ms=request.session_timeout_ms,
                rebalance_timeout_ms=request.rebalance_timeout_ms,
            )
            group.members[member.member_id] = member
            log.info("group %s: member %s added", group.group_id, member.member_id)
        else:
            member.protocols = list(request.protocols)
            member.session_timeout_ms = request.session_timeout_ms
            member.rebalance_timeout_ms = request.rebalance_timeout_ms
            if member.awaiting_join():  # a re-sent JoinGroup supersedes the one still waiting
                member.join_future.set_result(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member.member_id))
        group.protocol_type = request.protocol_type
        member.last_heartbeat = time.monotonic()
        return member

    def _can_answer_from_stable(self, group: Group, member: Member, request: JoinRequest) -> bool:
        """A follower rejoining a stable group with unchanged metadata gets the current generation.
        Only for existing members: a new member always triggers a rebalance (it has no assignment)."""
        if group.state is not GroupState.STABLE or member.member_id == group.leader_id:
            return False
        return member.metadata_for(group.protocol_name) == dict(request.protocols).get(group.protocol_name)

    def _join_result(self, group: Group, member: Member) -> JoinResult:
        members = []
        if member.member_id == group.leader_id:
            members = [
                (m.member_id, m.group_instance_id, m.metadata_for(group.protocol_name))
                for m in group.members.values()
            ]
        return JoinResult(
            ErrorCode.NONE,
            member.member_id,
            group.generation,
            group.protocol_type,
            group.protocol_name,
            group.leader_id or "",
            members,
        )

    # -- rebalancing -----------------------------------------------------------------------------

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        loop = asyncio.get_running_loop()
        was_empty = group.state is GroupState.EMPTY
        group.state = GroupState.PREPARING_REBALANCE
        group.rebalance_epoch += 1
        self._fail_waiting_syncs(group)
        delay_s = self.config.initial_rebalance_delay_ms / 1000 if was_empty else 0.0
        group.join_not_before = time.monotonic() + delay_s
        timeout_s = max((m.rebalance_timeout_ms for m in group.members.values()), default=0) / 1000
        epoch = group.rebalance_epoch
        if delay_s:
            loop.call_later(delay_s, self._maybe_complete_join, group, epoch)
        loop.call_later(max(timeout_s, delay_s), self._complete_join, group, epoch)
        log.info("group %s: preparing rebalance (%s)", group.group_id, reason)

    def _fail_waiting_syncs(self, group: Group) -> None:
        for member in group.members.values():
            if member.sync_future is not None and not member.sync_future.done():
                member.sync_future.set_result(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))

    def _maybe_complete_join(self, group: Group, epoch: int | None = None) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        if epoch is not None and epoch != group.rebalance_epoch:
            return
        if time.monotonic() < group.join_not_before:
            return
        if group.pending or not all(m.awaiting_join() for m in group.members.values()):
            return
        self._complete_join(group, group.rebalance_epoch)

    def _complete_join(self, group: Group, epoch: int) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE or epoch != group.rebalance_epoch:
            return
        for member in [m for m in group.members.values() if not m.awaiting_join()]:
            log.info("group %s: evicting %s (did not rejoin in time)", group.group_id, member.member_id)
            del group.members[member.member_id]
        group.pending.clear()
        group.generation += 1
        if not group.members:
            self._become_empty(group)
            return
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.protocol_name = self._choose_protocol(group)
        group.state = GroupState.COMPLETING_REBALANCE
        log.info(
            "group %s: generation %d with %d member(s), protocol %s",
            group.group_id,
            group.generation,
            len(group.members),
            group.protocol_name,
        )
        now = time.monotonic()
        for member in group.members.values():
            member.last_heartbeat = now
            future, member.join_future = member.join_future, None
            future.set_result(self._join_result(group, member))

    def _choose_protocol(self, group: Group) -> str | None:
        common = group.supported_protocols()
        leader = group.members[group.leader_id]
        return next((name for name, _ in leader.protocols if name in common), None)

    def _become_empty(self, group: Group) -> None:
        group.state = GroupState.EMPTY
        group.leader_id = None
        group.protocol_name = None
        log.info("group %s: empty at generation %d", group.group_id, group.generation)
        self._membership_changed()

    def _remove_members(self, group: Group, member_ids: list[str], reason: str) -> None:
        for member_id in member_ids:
            member = group.members.pop(member_id)
            if member.awaiting_join():
                member.join_future.set_result(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id))
            if member.sync_future is not None and not member.sync_future.done():
                member.sync_future.set_result(SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
            log.info("group %s: member %s removed (%s)", group.group_id, member_id, reason)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group)
        elif group.members:
            self._prepare_rebalance(group, reason)
        elif group.state is not GroupState.EMPTY:
            group.generation += 1
            self._become_empty(group)

    # -- SyncGroup -------------------------------------------------------------------------------

    async def sync(
        self, group_id: str, generation: int, member_id: str, assignments: dict[str, bytes]
    ) -> SyncResult:
        group = self.groups.get(group_id)
        error = self._member_error(group, generation, member_id)
        if error is not None:
            return SyncResult(error)
        member = group.members[member_id]
        if group.state is GroupState.PREPARING_REBALANCE:
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        if group.state is GroupState.STABLE:
            return self._sync_result(group, member)
        if member_id == group.leader_id:
            self._apply_assignment(group, assignments)
            return self._sync_result(group, member)
        member.sync_future = asyncio.get_running_loop().create_future()
        return await member.sync_future

    def _apply_assignment(self, group: Group, assignments: dict[str, bytes]) -> None:
        group.state = GroupState.STABLE
        for member in group.members.values():
            member.assignment = assignments.get(member.member_id, b"")
            if member.sync_future is not None and not member.sync_future.done():
                member.sync_future.set_result(self._sync_result(group, member))
        log.info("group %s: stable at generation %d", group.group_id, group.generation)
        self._membership_changed()

    def _sync_result(self, group: Group, member: Member) -> SyncResult:
        member.last_heartbeat = time.monotonic()
        return SyncResult(ErrorCode.NONE, member.assignment, group.protocol_type, group.protocol_name)

    def _member_error(self, group: Group | None, generation: int, member_id: str) -> int | None:
        if group is None or member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        return None

    # -- Heartbeat / LeaveGroup ------------------------------------------------------------------

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> int:
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        group.members[member_id].last_heartbeat = time.monotonic()
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        # CompletingRebalance: a member may heartbeat between its JoinGroup and SyncGroup; like
        # current Kafka, that is a normal heartbeat (answering REBALANCE_IN_PROGRESS would make it
        # rejoin and start another rebalance)
        return ErrorCode.NONE

    def leave(self, group_id: str, member_ids: list[str]) -> dict[str, int]:
        """Remove members; returns an error code per member id."""
        group = self.groups.get(group_id)
        if group is None:
            return dict.fromkeys(member_ids, ErrorCode.UNKNOWN_MEMBER_ID)
        codes = {m: ErrorCode.NONE if m in group.members else ErrorCode.UNKNOWN_MEMBER_ID for m in member_ids}
        leaving = [m for m, code in codes.items() if code == ErrorCode.NONE]
        if leaving:
            self._remove_members(group, leaving, "left the group")
        return codes

    # -- offsets validation ----------------------------------------------------------------------

    def commit_error(self, group_id: str, generation: int, member_id: str) -> int | None:
        """Why an OffsetCommit must be refused, or None (Kafka's rules for the classic protocol)."""
        group = self.groups.get(group_id)
        if generation < 0 and not member_id and (group is None or not group.members):
            return None  # a commit from outside any generation (assign() consumers, admin tools)
        error = self._member_error(group, generation, member_id)
        if error is not None:
            return error
        if group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        group.members[member_id].last_heartbeat = time.monotonic()
        return None

    # -- session expiry --------------------------------------------------------------------------

    async def _reap_forever(self) -> None:
        interval = self.config.session_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self.expire_sessions(time.monotonic())

    def expire_sessions(self, now: float) -> None:
        for group in list(self.groups.values()):
            group.pending = {m: deadline for m, deadline in group.pending.items() if deadline > now}
            expired = [
                m.member_id
                for m in group.members.values()
                if not m.awaiting_join() and now - m.last_heartbeat > m.session_timeout_ms / 1000
            ]
            if expired:
                self._remove_members(group, expired, "session timed out")
            elif group.state is GroupState.PREPARING_REBALANCE:
                self._maybe_complete_join(group)

    # -- describing ------------------------------------------------------------------------------

    def describe(self, group_id: str) -> Group | None:
        return self.groups.get(group_id)

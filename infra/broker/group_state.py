"""The data of consumer groups: their states, members and the requests and answers of the group
protocol, and the JSON form a stable group is kept in across a broker restart.

Plain values only; the coordinator (groups.py) owns how they change.
"""

from __future__ import annotations

import asyncio
import base64
import enum
import time
from dataclasses import dataclass, field


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass
class JoinRequest:
    """What a JoinGroup carries, independent of its wire version."""

    group_id: str
    member_id: str
    client_id: str
    client_host: str
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    group_instance_id: str | None = None
    requires_known_member_id: bool = True  # JoinGroup v4+ (KIP-394)


@dataclass
class JoinResult:
    error: int
    member_id: str
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    # only for the leader: (member_id, group_instance_id, metadata) of every member
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)


@dataclass
class SyncResult:
    error: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass
class Member:
    member_id: str
    client_id: str
    client_host: str
    group_instance_id: str | None
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    assignment: bytes = b""
    last_heartbeat: float = field(default_factory=time.monotonic)
    join_future: asyncio.Future | None = None
    sync_future: asyncio.Future | None = None

    def metadata_for(self, protocol: str | None) -> bytes:
        return dict(self.protocols).get(protocol, b"")

    def awaiting_join(self) -> bool:
        return self.join_future is not None and not self.join_future.done()


@dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending: dict[str, float] = field(default_factory=dict)  # member id -> deadline (monotonic)
    rebalance_epoch: int = 0
    join_not_before: float = 0.0

    def supported_protocols(self) -> set[str]:
        names = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*names) if names else set()


def group_record(group: Group) -> dict:
    """A stable group as plain JSON data (bytes as base64), for the broker's state file."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return {
        "generation": group.generation,
        "protocol_type": group.protocol_type,
        "protocol_name": group.protocol_name,
        "leader_id": group.leader_id,
        "members": [
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "group_instance_id": m.group_instance_id,
                "protocol_type": m.protocol_type,
                "protocols": [[name, b64(meta)] for name, meta in m.protocols],
                "session_timeout_ms": m.session_timeout_ms,
                "rebalance_timeout_ms": m.rebalance_timeout_ms,
                "assignment": b64(m.assignment),
            }
            for m in group.members.values()
        ],
    }


def group_from_record(group_id: str, record: dict) -> Group:
    """The inverse of `group_record`: a stable group whose members start a fresh session."""
    members = {}
    for m in record["members"]:
        members[m["member_id"]] = Member(
            member_id=m["member_id"],
            client_id=m["client_id"],
            client_host=m["client_host"],
            group_instance_id=m["group_instance_id"],
            protocol_type=m["protocol_type"],
            protocols=[(name, base64.b64decode(meta)) for name, meta in m["protocols"]],
            session_timeout_ms=m["session_timeout_ms"],
            rebalance_timeout_ms=m["rebalance_timeout_ms"],
            assignment=base64.b64decode(m["assignment"]),
        )
    return Group(
        group_id,
        state=GroupState.STABLE,
        generation=record["generation"],
        protocol_type=record["protocol_type"],
        protocol_name=record["protocol_name"],
        leader_id=record["leader_id"],
        members=members,
    )

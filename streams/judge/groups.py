"""Group mode's state: the ended members of a group (forwarded by the judge processor, keyed by
group id) kept in the `groups` mapping until the group is judged together.

Pure over that mapping: `add_member` stores a member and says when its group is full;
`close_group` records that the group was judged (and whom it judged, so a member forwarded again
after a restart is not judged twice). Building the request is `request_builders.group_request`.
"""

from __future__ import annotations

from collections.abc import MutableMapping


def new_group(member: dict) -> dict:
    """The record of a group, from its first member."""
    return {
        "task": member.get("task", ""),
        "domain": member.get("domain", "generic"),
        "rule": member["rule"],
        "expected": member.get("expected"),
        "members": {},
        "done": False,
    }


def add_member(groups: MutableMapping, member: dict, now: float) -> dict | None:
    """Add `member` to its group. Returns the group when it has reached its expected size (to be
    judged, then `close_group`d; it is not stored), else stores it and returns None. A member
    already judged with its group is ignored; one arriving after its group was judged starts a new
    round (judged on its own unless others join it)."""
    group_id = member["group_id"]
    group = groups.get(group_id) or new_group(member)
    if member["trajectory_id"] in group.get("judged", ()):
        return None  # forwarded again after a restart: already judged with its group
    if group["done"]:
        group = {**group, "members": {}, "done": False}  # a late member: judged on its own
    group["members"][member["trajectory_id"]] = member
    group["last_seen"] = now
    expected = group.get("expected")
    if expected and len(group["members"]) >= expected:
        return group
    groups[group_id] = group
    return None


def close_group(groups: MutableMapping, group_id: str, group: dict, now: float) -> None:
    """Record that `group` was judged at `now`: members cleared, every trajectory judged so far kept."""
    judged = sorted({*group.get("judged", ()), *group["members"]})
    groups[group_id] = {**group, "members": {}, "done": True, "judged": judged, "done_at": now}

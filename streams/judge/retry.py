"""The queue of budget-paused judge requests: parked in the judge's own durable state, run again
once their `retry_at` has passed. Pure.

A request the budget refused is parked as a JSON-able dict (its prompt, rubrics and targets, so
it is asked again exactly: same cache key, same event ids) in the state record it came from: the
trajectory's record in the `state` table, or the group's in `groups`. Those tables are
changelog-backed and partitioned like their inputs, so the queue survives a restart and moves
with its partition to whichever replica owns it. The processor's timer (`flush_stale_steps`)
takes the due entries and runs them; a request refused again is parked again with the next
`retry_at` (and its targets get another `budget_paused` event with that time).

>>> from datetime import UTC, datetime
>>> rec = {"paused": [{"retry_at": "2026-01-01T11:00:00+00:00", "request": {}}]}
>>> take_due(rec, datetime(2026, 1, 1, 10, 59, tzinfo=UTC))
[]
>>> len(take_due(rec, datetime(2026, 1, 1, 11, 0, tzinfo=UTC))), rec
(1, {})
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from dataclasses import asdict
from datetime import datetime

from streams.judge.prompt import Prompt
from streams.judge.requests import JudgeRequest, Target
from streams.judge.rubrics import RubricSet
from streams.judge.state import BytesKeyed, StagedState

PAUSED = "paused"  # the state record's field holding its parked requests
_MARKER = b'"paused":'


def parked_at(request: JudgeRequest) -> tuple[str, str]:
    """Where a request is parked: ("groups", group id) for a group call, else ("state", trajectory id)."""
    first = request.targets[0]
    if request.mode == "group" and first.group_id:
        return "groups", first.group_id
    return "state", first.trajectory_id


def request_dict(request: JudgeRequest) -> dict:
    return {
        "mode": request.mode,
        "prompt": {
            "system": request.prompt.system,
            "user": request.prompt.user,
            "version": request.prompt.version,
        },
        "rubrics": request.rubrics.model_dump(mode="json"),
        "targets": [asdict(t) for t in request.targets],
        "model": request.model,
    }


def request_from(data: dict) -> JudgeRequest:
    return JudgeRequest(
        data["mode"],
        Prompt(**data["prompt"]),
        RubricSet.model_validate(data["rubrics"]),
        [Target(**t) for t in data["targets"]],
        model=data.get("model", ""),
    )


def park(rec: dict, request: JudgeRequest, retry_at: datetime) -> None:
    """Add a refused request to its state record, to run at `retry_at`."""
    rec.setdefault(PAUSED, []).append({"retry_at": retry_at.isoformat(), "request": request_dict(request)})


def take_due(rec: dict, now: datetime) -> list[dict]:
    """Remove and return the parked entries whose `retry_at` has passed (the field goes when empty)."""
    entries = rec.get(PAUSED) or []
    due = [e for e in entries if datetime.fromisoformat(e["retry_at"]) <= now]
    left = [e for e in entries if datetime.fromisoformat(e["retry_at"]) > now]
    if left:
        rec[PAUSED] = left
    else:
        rec.pop(PAUSED, None)
    return due


def keys_with_parked(mapping: MutableMapping) -> Iterator[str]:
    """Keys of the records holding parked requests. For a table (raw orjson bytes) the values are
    scanned for the field name before anything is decoded, so a timer tick over a large state
    stays cheap."""
    staged = getattr(mapping, "staged", {})
    for key, value in list(staged.items()):
        if isinstance(value, dict) and value.get(PAUSED):
            yield key
    durable = mapping.durable if isinstance(mapping, StagedState) else mapping
    if isinstance(durable, BytesKeyed):
        for raw_key, raw in list(durable.store.items()):
            key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            if raw and _MARKER in raw and key not in staged:
                yield key
        return
    for key, value in list(durable.items()):
        if key not in staged and isinstance(value, dict) and value.get(PAUSED):
            yield key


def has_parked(rec: dict | None) -> bool:
    return bool(rec and rec.get(PAUSED))

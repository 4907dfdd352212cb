"""What the trajectory list shows, as a `TrajectoryFilter` parsed from URL query values.

Every value comes from a user: `parse_filter` checks each one (length, number, time within what
ClickHouse holds, ranges in order) and a malformed one raises `FilterError` naming the field and the
value. The SQL that binds a filter is in trajectory_list.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from infra.errors import FilterError

MAX_PAGE_SIZE = 200
MAX_TEXT = 200
# time filters: within what ClickHouse's Date and DateTime64 both hold (out of it the engine refuses
# the bound value, or saturates it); no event is recorded outside it
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC).replace(tzinfo=None)  # naive UTC, as `_time` returns
LATEST = datetime(2149, 6, 6, tzinfo=UTC).replace(tzinfo=None)
_TRUE = {"true", "1", "yes", "success", "succeeded"}
_FALSE = {"false", "0", "no", "failure", "failed"}


@dataclass(frozen=True)
class TrajectoryFilter:
    """What the trajectory list shows: every field optional, all of them ANDed."""

    domain: str | None = None
    agent: str | None = None
    model: str | None = None
    policy_version: str | None = None
    success: bool | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    since: datetime | None = None
    until: datetime | None = None
    search: str | None = None  # case-insensitive substring of the task
    reward_version: str | None = None  # None: the newest complete version (infra.clickhouse.versions)
    page: int = 1
    page_size: int = 50
    default_page_size: int = field(default=50, compare=False)  # what a URL without page_size gives

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.page_size

    def to_query(self, **changes: Any) -> dict[str, str]:
        """The URL query that gives this filter back (defaults left out), with `changes` applied."""
        values = asdict(replace(self, **changes))
        defaults = {**asdict(TrajectoryFilter()), "page_size": self.default_page_size}
        values.pop("default_page_size")
        return {k: _show(v) for k, v in values.items() if v is not None and v != defaults[k]}


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%S")
    return str(value)


def parse_filter(query: Mapping[str, str], page_size: int = 50) -> TrajectoryFilter:
    """A `TrajectoryFilter` from URL query values; empty values are unset, unknown keys ignored.

    >>> parse_filter({"domain": "code", "success": "false", "reward_min": "0.5"}).success
    False
    >>> parse_filter({"page": "0"})
    Traceback (most recent call last):
    ...
    infra.errors.FilterError: page='0': must be a whole number from 1 to 100000
    """
    given = {k: v.strip() for k, v in query.items() if isinstance(v, str) and v.strip()}
    values: dict[str, Any] = {"page_size": _int(given, "page_size", page_size, 1, MAX_PAGE_SIZE)}
    values["default_page_size"] = page_size
    for name in ("domain", "agent", "model", "policy_version", "search", "reward_version"):
        if name in given:
            values[name] = _text(name, given[name])
    if "success" in given:
        values["success"] = _success(given["success"])
    for name in ("reward_min", "reward_max"):
        if name in given:
            values[name] = _float(name, given[name])
    for name in ("since", "until"):
        if name in given:
            values[name] = _time(name, given[name])
    values["page"] = _int(given, "page", 1, 1, 100_000)
    _check_ranges(values)
    return TrajectoryFilter(**values)


def _text(name: str, value: str) -> str:
    if len(value) > MAX_TEXT:
        raise FilterError(name, value[:40] + "...", f"at most {MAX_TEXT} characters")
    return value


def _success(value: str) -> bool | None:
    lowered = value.lower()
    if lowered in ("any", "all"):
        return None
    if lowered in _TRUE or lowered in _FALSE:
        return lowered in _TRUE
    raise FilterError("success", value, "must be true, false or any")


def _float(name: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise FilterError(name, value, "must be a number, e.g. 0.5") from None
    if not math.isfinite(number):
        raise FilterError(name, value, "must be a finite number")
    return number


def _time(name: str, value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise FilterError(
            name, value, "must be a date or time, e.g. 2026-11-25 or 2026-11-25T14:30"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC).replace(tzinfo=None)
    if not EARLIEST <= moment <= LATEST:
        raise FilterError(name, value, f"must be from {EARLIEST:%Y-%m-%d} to {LATEST:%Y-%m-%d}")
    return moment


def _int(given: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    if name not in given:
        return default
    value = given[name]
    if not value.isdigit() or not low <= int(value) <= high:
        raise FilterError(name, value, f"must be a whole number from {low} to {high}")
    return int(value)


def _check_ranges(values: dict[str, Any]) -> None:
    low, high = values.get("reward_min"), values.get("reward_max")
    if low is not None and high is not None and low > high:
        raise FilterError("reward_min", low, f"is above reward_max={high}")
    since, until = values.get("since"), values.get("until")
    if since is not None and until is not None and since > until:
        raise FilterError("since", _show(since), f"is after until={_show(until)}")

"""Spend budget per hour and per day (UTC calendar windows) for judge calls.

Before a call the processor asks `reserve(estimate)`: when the spend of the current hour or day
(settled costs plus reservations of calls in flight) has reached its cap, judging pauses and the
answer is the time the blocking window ends (`retry_at`); the processor emits
`reward.judge.failed` with kind "budget_paused" and that time. After a call, `settle` replaces the
reservation with the real cost. A new window starts from zero, so judging resumes by itself.
A call may overshoot the cap by at most its own cost (the check is "cap not yet reached").
The spend lives in the worker's memory: a restarted worker starts the current windows at zero.

>>> from datetime import UTC, datetime
>>> now = [datetime(2026, 1, 1, 10, 59, tzinfo=UTC)]
>>> b = SpendBudget(per_hour=0.01, per_day=None, clock=lambda: now[0])
>>> b.reserve(0.004) is None
True
>>> b.settle(0.004, 0.012)
>>> b.reserve(0.004)
datetime.datetime(2026, 1, 1, 11, 0, tzinfo=datetime.timezone.utc)
>>> now[0] = datetime(2026, 1, 1, 11, 0, 1, tzinfo=UTC)
>>> b.reserve(0.004) is None
True
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta


def _utc_now() -> datetime:
    return datetime.now(UTC)


class SpendBudget:
    def __init__(
        self,
        per_hour: float | None,
        per_day: float | None,
        clock: Callable[[], datetime] = _utc_now,
    ):
        self.per_hour = per_hour
        self.per_day = per_day
        self.clock = clock
        self._spent: dict[tuple[str, datetime], float] = {}

    def _windows(self, now: datetime) -> list[tuple[str, datetime, datetime, float]]:
        hour = now.replace(minute=0, second=0, microsecond=0)
        day = hour.replace(hour=0)
        windows = []
        if self.per_hour is not None:
            windows.append(("hour", hour, hour + timedelta(hours=1), self.per_hour))
        if self.per_day is not None:
            windows.append(("day", day, day + timedelta(days=1), self.per_day))
        return windows

    def reserve(self, estimate: float) -> datetime | None:
        """Reserve `estimate` USD for a call; None if allowed, else when judging may resume."""
        now = self.clock()
        windows = self._windows(now)
        blocked = [end for kind, start, end, cap in windows if self._spent.get((kind, start), 0.0) >= cap]
        if blocked:
            return max(blocked)
        for kind, start, _end, _cap in windows:
            self._spent[(kind, start)] = self._spent.get((kind, start), 0.0) + estimate
        self._forget_old(now)
        return None

    def settle(self, estimate: float, actual: float) -> None:
        """Replace a reservation by the real cost (windows of now; a call crossing a boundary is
        charged to the window it ends in)."""
        for kind, start, _end, _cap in self._windows(self.clock()):
            self._spent[(kind, start)] = max(0.0, self._spent.get((kind, start), 0.0) - estimate) + actual

    def spent(self) -> dict[str, float]:
        """Spend of the current hour and day (for logs and the bench)."""
        return {
            kind: self._spent.get((kind, start), 0.0) for kind, start, _e, _c in self._windows(self.clock())
        }

    def _forget_old(self, now: datetime) -> None:
        cutoff = now - timedelta(days=2)
        for key in [k for k in self._spent if k[1] < cutoff]:
            del self._spent[key]

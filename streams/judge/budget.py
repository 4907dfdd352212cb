"""The judge's spend budget: USD caps per UTC hour and per UTC day, as a deterministic book of
reservation records. Pure (no I/O); `SpendBudget` keeps the book in this process's memory, and
streams/judge/ledger.py keeps it in a Kafka topic shared by every replica and every restart.

Protocol: before a call the processor *reserves* an estimate (an upper bound of its cost, see
`JudgeCalls.estimate`); after the call it *settles* the reservation with the real cost (0 when
the call failed). Each is a record:

- ``{"op": "reserve", "id", "amount", "at", "windows": [[key, end, cap], ...], "until"}`` (`until`:
  when the call it pays for can no longer be in flight; absent in older records)
- ``{"op": "settle", "id", "actual"}``

`BudgetBook.apply` folds records in log order. A reservation is granted when, in every window it
names, the spend (settled costs plus open reservations) plus its amount stays within the window's
cap; otherwise it is refused with `retry_at`, the end of the latest blocking window. The decision
depends only on the records before it, so every reader of the same log (each replica, a restarted
worker replaying it) reaches the same decisions and the same totals: the book is a replicated
state machine. Caps travel in the record, so replicas with different settings still agree.

Why the cap holds: every granted call is counted by its estimate from the moment it is granted
until it is settled, so calls in flight on any replica are already in the total a later
reservation is checked against; concurrency adds no overshoot. The only overshoot left is an
estimate below the real cost (the settlement then charges the real cost). A reservation that is
never settled (the worker died during the call) keeps its estimate until its windows end, which
errs on the side of spending less. Duplicate records (a producer retry) are ignored by id.

A refusal is `waitable` when the reservations still open in the blocking windows are what keeps
it out (it would fit if they settled at 0): the caller then waits for settlements and asks
again instead of pausing for the rest of the window (estimates are upper bounds, so calls in
flight usually settle well below them). Only reservations that may still be in flight count for
that: one past its `until` (its worker was killed during the call) will never settle, so waiting
for it would only stall every request of every replica; the refusal is then a pause.

>>> from datetime import UTC, datetime
>>> t = datetime(2026, 1, 1, 10, 59, tzinfo=UTC)
>>> book = BudgetBook()
>>> book.apply(reserve_record("r1", 0.006, t, caps(0.01, None)))  # granted: None
>>> book.apply(reserve_record("r2", 0.006, t, caps(0.01, None)))  # 0.012 > 0.01: refused
datetime.datetime(2026, 1, 1, 11, 0, tzinfo=datetime.timezone.utc)
>>> book.apply(settle_record("r1", 0.003))
>>> book.apply(reserve_record("r3", 0.006, t, caps(0.01, None))) is None  # 0.009 fits
True
>>> round(book.spent_at(t)["hour"], 6)
0.009
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

EPSILON = 1e-12  # float sums of many small costs: "equal to the cap" must still fit
KEEP_ENDED = timedelta(days=1)  # ended windows are kept this long (a lagging clock may still name them)


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Window:
    """One capped window: `kind` is "hour" or "day"; `key` names it in records."""

    kind: str
    start: datetime
    end: datetime
    cap: float

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.start.isoformat()}"


def caps(per_hour: float | None, per_day: float | None) -> dict[str, float]:
    """The caps that are set, by window kind."""
    return {k: v for k, v in (("hour", per_hour), ("day", per_day)) if v is not None}


def windows_at(now: datetime, window_caps: dict[str, float]) -> list[Window]:
    """The UTC calendar windows containing `now`, for the kinds that have a cap.

    >>> [w.key for w in windows_at(datetime(2026, 3, 1, 23, 30, tzinfo=UTC), {"hour": 1, "day": 5})]
    ['hour:2026-03-01T23:00:00+00:00', 'day:2026-03-01T00:00:00+00:00']
    """
    now = now.astimezone(UTC)
    hour = now.replace(minute=0, second=0, microsecond=0)
    day = hour.replace(hour=0)
    spans = {"hour": (hour, hour + timedelta(hours=1)), "day": (day, day + timedelta(days=1))}
    return [Window(kind, *spans[kind], cap) for kind, cap in window_caps.items()]


def reserve_record(
    rid: str, amount: float, now: datetime, window_caps: dict[str, float], hold_s: float | None = None
) -> dict:
    """A reservation made at `now`; `hold_s`: the longest its call can take (None: unbounded)."""
    windows = [[w.key, w.end.isoformat(), w.cap] for w in windows_at(now, window_caps)]
    record = {"op": "reserve", "id": rid, "amount": amount, "at": now.isoformat(), "windows": windows}
    if hold_s is not None:
        record["until"] = (now + timedelta(seconds=hold_s)).isoformat()
    return record


def settle_record(rid: str, actual: float) -> dict:
    return {"op": "settle", "id": rid, "actual": actual}


def new_reservation_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Reservation:
    """The answer to a reservation: granted (`retry_at` None) or refused until `retry_at`."""

    id: str
    amount: float
    retry_at: datetime | None = None
    waitable: bool = False  # refused only because of reservations still open (see the module doc)

    @property
    def granted(self) -> bool:
        return self.retry_at is None


class BudgetBook:
    """Spend per window key, folded from reservation records in log order (see the module doc)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.held: dict[str, float] = {}  # the part of `spent` that is open reservations
        self.waitable = False  # whether the last refusal was `waitable`
        self.ends: dict[str, datetime] = {}
        self.open: dict[str, tuple[list[str], float]] = {}  # granted, not yet settled
        self.until: dict[str, datetime] = {}  # of open reservations: when their call can no longer run
        self.decided: dict[str, tuple[datetime | None, datetime]] = {}  # id -> (retry_at, last end)

    def apply(self, record: dict) -> datetime | None:
        """Fold one record. For a reservation: None if granted, else the time to retry."""
        if record.get("op") == "settle":
            self._settle(record["id"], float(record["actual"]))
            return None
        rid = record["id"]
        if rid in self.decided:
            return self.decided[rid][0]  # a duplicate: the first copy decided
        amount = float(record["amount"])
        windows = [(key, datetime.fromisoformat(end), float(cap)) for key, end, cap in record["windows"]]
        over = [
            (key, end, cap) for key, end, cap in windows if self.spent.get(key, 0.0) + amount > cap + EPSILON
        ]
        retry_at = max(end for _k, end, _c in over) if over else None
        at = datetime.fromisoformat(record["at"])
        in_flight = self._in_flight(at) if over else {}
        self.waitable = bool(over) and all(
            self.spent.get(key, 0.0) - in_flight.get(key, 0.0) + amount <= cap + EPSILON
            for key, _e, cap in over
        )
        if retry_at is None:
            for key, end, _cap in windows:
                self.spent[key] = self.spent.get(key, 0.0) + amount
                self.held[key] = self.held.get(key, 0.0) + amount
                self.ends[key] = end
            self.open[rid] = ([key for key, _e, _c in windows], amount)
            if record.get("until"):
                self.until[rid] = datetime.fromisoformat(record["until"])
        last_end = max((end for _k, end, _c in windows), default=at)
        self.decided[rid] = (retry_at, last_end)
        self._forget(at)
        return retry_at

    def _in_flight(self, at: datetime) -> dict[str, float]:
        """Per window key, the open reservations whose calls may still be running at `at`."""
        if not self.until:
            return self.held
        running: dict[str, float] = {}
        for rid, (keys, amount) in self.open.items():
            if rid not in self.until or self.until[rid] > at:
                for key in keys:
                    running[key] = running.get(key, 0.0) + amount
        return running

    def _settle(self, rid: str, actual: float) -> None:
        keys, amount = self.open.pop(rid, (None, 0.0))
        self.until.pop(rid, None)
        for key in keys or ():
            if key in self.spent:
                self.spent[key] = max(0.0, self.spent[key] - amount + actual)
                self.held[key] = max(0.0, self.held.get(key, 0.0) - amount)

    def _forget(self, now: datetime) -> None:
        cutoff = now - KEEP_ENDED
        for key in [k for k, end in self.ends.items() if end < cutoff]:
            self.spent.pop(key, None)
            self.held.pop(key, None)
            del self.ends[key]
        for rid in [r for r, (_retry, end) in self.decided.items() if end < cutoff]:
            del self.decided[rid]
            self.open.pop(rid, None)
            self.until.pop(rid, None)

    def spent_at(self, now: datetime) -> dict[str, float]:
        """Spend (settled plus open reservations) of the windows containing `now`, by kind."""
        return {w.kind: self.spent.get(w.key, 0.0) for w in windows_at(now, {"hour": 0.0, "day": 0.0})}


class SpendBudget:
    """The book in this process's memory: one worker, lost on restart (tests, the bench, and a
    worker without the shared ledger). Same interface as `ledger.SharedBudget`."""

    def __init__(
        self,
        per_hour: float | None,
        per_day: float | None,
        clock: Callable[[], datetime] = utc_now,
    ):
        self.caps = caps(per_hour, per_day)
        self.clock = clock
        self.book = BudgetBook()
        self.settled = asyncio.Event()

    @property
    def enabled(self) -> bool:
        return bool(self.caps)

    async def open(self) -> None:
        """Nothing to load (the shared budget reads its log here)."""

    async def reserve(self, amount: float, hold_s: float | None = None) -> Reservation:
        """Reserve `amount` for a call that takes at most `hold_s` seconds (None: unbounded)."""
        rid = new_reservation_id()
        retry_at = self.book.apply(reserve_record(rid, amount, self.clock(), self.caps, hold_s))
        return Reservation(rid, amount, retry_at, retry_at is not None and self.book.waitable)

    async def settle(self, reservation: Reservation, actual: float) -> None:
        self.book.apply(settle_record(reservation.id, actual))
        self.settled.set()

    async def wait_settled(self, timeout_s: float) -> None:
        """Until the next settlement, or `timeout_s`."""
        await wait_event(self.settled, timeout_s)

    def spent(self) -> dict[str, float]:
        """Spend of the current hour and day (for logs and the bench)."""
        return self.book.spent_at(self.clock())


async def wait_event(event: asyncio.Event, timeout_s: float) -> None:
    """Wait for the next `set` of `event` (cleared first), at most `timeout_s`."""
    event.clear()
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        pass

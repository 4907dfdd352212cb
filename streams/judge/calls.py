"""Paying for judge calls: the reply cache, the budget reservation, the call and its settlement.

`JudgeCalls.run(request)` answers one `JudgeRequest` with its events, in this order:

1. the reply cache (content hash of prompt version, model and prompt text): a hit costs nothing;
   two requests for the same content in one process make one call (the second waits for it);
2. with a budget set, a reservation of `estimate(request)`; refused only because of calls still
   in flight (`waitable`), it waits for their settlements and asks again (one waiting request
   per process at a time, for at most the longest a call can take; a reservation left open by a
   worker killed mid-call stops counting as in flight once that time has passed); refused, the targets get
   `reward.judge.failed` kind "budget_paused" with `retry_at`, and the outcome carries
   `paused_until` so the processor parks the request and runs it again then (streams/judge/retry.py);
3. the call (streams/judge/client.py), then the settlement: the real cost of the reply; 0 for an
   HTTP error answer (not charged); the estimate kept for a call that got no answer at all (a
   timeout may still be charged by the provider);
4. a reply that parsed is stored in the cache with its call's facts (durably, with the shared
   cache, before the events are returned): a replay of this batch gets the same events again,
   cost included (streams/judge/cache.py `CallRecord`).

The estimate is meant as an upper bound, so the cap holds (streams/judge/budget.py): the output at
`max_tokens` (the endpoint never returns more) and the input at `chars_per_token` characters per
token (3 by default; English and code run at 3.5 to 4 with Claude's tokenizer). A denser input
than that is the one way a settled total can exceed its estimate.

A `budget_paused` event's id includes its `retry_at`: a request refused again in a later window
publishes a new fact (a later `retry_at`), not a duplicate of the first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime

from schemas.events import EventBase
from schemas.ids import derived_event_id
from streams.errors import JudgeCallError, ParseError
from streams.judge.budget import Reservation, SpendBudget
from streams.judge.cache import CallRecord, ReplyCache, content_key
from streams.judge.client import CallResult, JudgeClient
from streams.judge.config import JudgeConfig
from streams.judge.pricing import call_cost
from streams.judge.requests import CallMeta, JudgeRequest, failure_events, reply_events

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 3.0


@dataclass
class JudgeStats:
    calls: int = 0
    cache_hits: int = 0
    scored: int = 0
    failed: int = 0
    budget_paused: int = 0
    retried: int = 0  # parked requests run again after their window reopened
    cost_usd: float = 0.0
    overhead_s: float = 0.0  # time spent in the processor itself around calls (not awaiting the model)


@dataclass
class Outcome:
    """The events answering one request; `paused_until` set when the budget refused it."""

    events: list[EventBase]
    paused_until: datetime | None = None


class JudgeCalls:
    """The call path of one judge processor (its budget and cache may be swapped for the shared
    ones, streams/judge/ledger.py, before the first call)."""

    def __init__(
        self,
        config: JudgeConfig,
        client: JudgeClient,
        budget: SpendBudget,
        cache: ReplyCache,
        stats: JudgeStats,
        now: Callable[[], datetime],
        chars_per_token: float = CHARS_PER_TOKEN,
    ):
        self.config, self.client, self.budget, self.cache = config, client, budget, cache
        self.stats, self.now, self.chars_per_token = stats, now, chars_per_token
        self._inflight: dict[str, asyncio.Future] = {}
        self._room = asyncio.Lock()  # one request per process waits for room in the budget

    async def open(self) -> None:
        """Load the budget and the cache (the shared ones read their topics to the end)."""
        await self.cache.open()
        if self.budget.enabled:
            await self.budget.open()

    async def run(self, request: JudgeRequest) -> Outcome:
        key = content_key(
            request.prompt.version, self.config.model, request.prompt.system, request.prompt.user
        )
        cached = await self._cached_text(key)
        if cached is not None:
            self.stats.cache_hits += 1
            return Outcome(self._from_cache(request, CallRecord.decode(cached)))
        future = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            outcome, record = await self._call(request)
            if record is not None:
                await self.cache.store(key, record.encode())
        finally:
            self._inflight.pop(key, None)
            future.set_result(None)  # waiters on the same content read the cache now
        return outcome

    def _from_cache(self, request: JudgeRequest, record: CallRecord) -> list[EventBase]:
        """The call's own events when the record is of these targets (same ids), else events
        marked cached at no cost."""
        if record.meta is not None and record.at is not None:
            events = reply_events(
                request, record.text, CallMeta(**record.meta), datetime.fromisoformat(record.at)
            )
            if [e.event_id for e in events] == record.ids:
                return events
        meta = CallMeta(self.config.model, request.prompt.version, cached=True)
        return reply_events(request, record.text, meta, self.now())

    async def _cached_text(self, key: str) -> str | None:
        text = self.cache.get(key)
        if text is None and key in self._inflight:
            await asyncio.shield(self._inflight[key])
            text = self.cache.get(key)
        return text

    async def _call(self, request: JudgeRequest) -> tuple[Outcome, CallRecord | None]:
        reservation = None
        if self.budget.enabled:
            reservation = await self._reserve(self.estimate(request))
            if not reservation.granted:
                return Outcome(self._paused(request, reservation.retry_at), reservation.retry_at), None
        self.stats.calls += 1
        try:
            result = await self.client.complete(request.prompt)
        except JudgeCallError as exc:
            # an HTTP error answer is not charged; no answer at all (a timeout) may be
            charged = 0.0 if exc.status is not None or exc.kind == "circuit_open" else None
            await self._settle(reservation, charged)
            events = failure_events(request, exc.reason, exc.kind, self.now(), attempts=exc.attempts)
            return Outcome(events), None
        cost = call_cost(
            self.config, result.model or self.config.model, result.input_tokens, result.output_tokens
        )
        await self._settle(reservation, cost)
        self.stats.cost_usd += cost
        return self._reply(request, result, cost)

    def _reply(
        self, request: JudgeRequest, result: CallResult, cost: float
    ) -> tuple[Outcome, CallRecord | None]:
        meta = CallMeta(
            result.model or self.config.model,
            request.prompt.version,
            result.input_tokens,
            result.output_tokens,
            cost,
            result.latency_ms,
        )
        now = self.now()
        try:
            events = reply_events(request, result.text, meta, now)
        except ParseError as exc:
            events = failure_events(request, str(exc), "parse", now, result.attempts, meta=meta)
            return Outcome(events), None
        if not any(e.type != "reward.judge.failed" for e in events):
            return Outcome(events), None
        record = CallRecord(result.text, asdict(meta), now.isoformat(), [e.event_id for e in events])
        return Outcome(events), record

    @property
    def longest_call_s(self) -> float:
        """How long a call's reservation is waited for: its attempts at their timeout. A reservation
        says so (`hold_s`), so other replicas stop waiting for it if its worker dies mid-call."""
        return self.config.timeout_s * self.config.max_attempts

    async def _reserve(self, amount: float) -> Reservation:
        reservation = await self.budget.reserve(amount, self.longest_call_s)
        if reservation.granted or not reservation.waitable:
            return reservation
        async with self._room:
            deadline = time.monotonic() + self.longest_call_s
            while reservation.waitable and time.monotonic() < deadline:
                await self.budget.wait_settled(0.5)
                reservation = await self.budget.reserve(amount, self.longest_call_s)
        return reservation

    async def _settle(self, reservation: Reservation | None, actual: float | None) -> None:
        """Settle at `actual`, or keep the estimate (None: what was charged is unknown)."""
        if reservation is not None:
            await self.budget.settle(reservation, reservation.amount if actual is None else actual)

    def _paused(self, request: JudgeRequest, retry_at: datetime) -> list[EventBase]:
        self.stats.budget_paused += 1
        reason = f"judge spend budget reached; paused until {retry_at.isoformat()}"
        events = failure_events(request, reason, "budget_paused", self.now(), retry_at=retry_at)
        return [
            e.model_copy(update={"event_id": derived_event_id(e.type, e.event_id, retry_at.isoformat())})
            for e in events
        ]

    def estimate(self, request: JudgeRequest) -> float:
        """An upper bound of the call's cost in USD (see the module doc)."""
        chars = len(request.prompt.system) + len(request.prompt.user)
        input_tokens = int(chars / self.chars_per_token) + 16
        return call_cost(self.config, self.config.model, input_tokens, self.config.max_tokens)

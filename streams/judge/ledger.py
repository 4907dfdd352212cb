"""The judge's cost state in the log, shared by every replica and every restart: the spend budget
and the reply cache (issue #17).

Two single-partition topics per deployment, named after the live judge app, `agentstream-judge`
(`LEDGER_PREFIX`; the worker's `--ledger-prefix`, `WorkerConfig.ledger_prefix`), whatever app id
the judge runs under: a replay's judge (`agentstream replay --roles judge`, app id
`agentstream-replay-<version>-<stamp>-judge`) reads the live judge's reply cache, so unchanged
inputs cost nothing, and spends from the same budget.

- `<prefix>-budget` (delete, kept 50 h: a day window plus slack): the budget book's records,
  `reserve` before a call and `settle` after it (streams/judge/budget.py).
- `<prefix>-cache` (compact + delete, kept 30 days like agent.events, so replaying the log
  within its retention pays for nothing twice): content hash -> reply text.

Every judge process reads both topics in full, with its own consumer outside the role's consumer
group (`JudgeLedger`): on start it reads them to their end before its first call, then follows
them. To spend, a process publishes a reservation and waits until it reads that record back;
the decision is the book's, computed from every record before it in the one partition, so all
processes agree on it.

Why this design, and not the alternatives:

- faust tables are partitioned by key and each replica only holds the partitions it owns; a
  table keyed by window would give one replica the budget and leave the others blind, and a
  GlobalTable (every replica holds everything) still decides locally before it has seen the
  other replicas' writes: two replicas at the cap would both spend (overshoot of one batch of
  calls per replica), and concurrent writes to one key lose updates.
- A single partition totally orders every reservation of every replica. Deciding at read-back
  ("reads its own writes before spending") turns the log into the lock: no overshoot from
  concurrency at all, whatever the number of replicas. The cost is one produce-and-read round
  trip per call (milliseconds, against judge calls of seconds).
- A restart replays the topic: the current windows keep their spend, and a reservation whose
  call was cut short keeps its estimate until its window ends (it errs towards spending less).
- The retry queue of budget-paused requests is not here: it is per trajectory, so it lives in
  the judge's partitioned state tables (streams/judge/retry.py) and moves with its partition.

A process that cannot publish or read back within `timeout_s` raises `JudgeLedgerError`; the
batch then fails and the role exits to be restarted from its committed offsets (no call is made
without a decision).

`share_state(app, processor, prefix)` swaps a judge processor's in-memory budget and cache for these.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

import orjson

from clients.kafka import ensure_topics, make_async_consumer, make_async_producer
from clients.kafka.ranges import follow_async, iter_range_async
from schemas.topics import DAY_MS, TopicSpec
from streams.errors import StreamsError
from streams.judge.budget import (
    BudgetBook,
    Reservation,
    caps,
    new_reservation_id,
    reserve_record,
    settle_record,
    utc_now,
    wait_event,
)
from streams.judge.cache import ReplyCache

log = logging.getLogger(__name__)

LEDGER_PREFIX = "agentstream-judge"  # the live judge's app id; WorkerConfig.ledger_prefix's default
BUDGET_SUFFIX = "budget"
CACHE_SUFFIX = "cache"
BUDGET_KEY = b"budget"


class JudgeLedgerError(StreamsError):
    """The shared budget or cache topic could not be written or read back in time."""

    retryable = True  # the broker's fault, not the batch's: the shell exits and replays it


def topic_specs(prefix: str) -> list[TopicSpec]:
    """The two topics under `prefix` (internal: named after the live judge app, not in the registry).

    >>> [spec.name for spec in topic_specs(LEDGER_PREFIX)]
    ['agentstream-judge-budget', 'agentstream-judge-cache']
    """
    return [
        TopicSpec(
            f"{prefix}-{BUDGET_SUFFIX}",
            (),
            partitions=1,
            key="budget",
            config={"cleanup.policy": "delete", "retention.ms": str(50 * 3600 * 1000)},
            description="judge spend reservations and settlements (one partition: one order)",
        ),
        TopicSpec(
            f"{prefix}-{CACHE_SUFFIX}",
            (),
            partitions=1,
            key="content hash",
            config={"cleanup.policy": "compact,delete", "retention.ms": str(30 * DAY_MS)},
            description="judge replies by content hash",
        ),
    ]


class JudgeLedger:
    """One process's reader and writer of the budget and cache topics."""

    def __init__(self, bootstrap: str, prefix: str, *, cache_entries: int, timeout_s: float = 30.0):
        self.bootstrap, self.timeout_s = bootstrap, timeout_s
        self.specs = topic_specs(prefix)
        self.budget_topic, self.cache_topic = (spec.name for spec in self.specs)
        self.book = BudgetBook()
        self.replies = ReplyCache(cache_entries)
        self.client_id = f"{prefix}-ledger"
        self._waiters: dict[str, asyncio.Future] = {}
        self.settled = asyncio.Event()  # set on every settlement read (any replica's)
        self._opening: asyncio.Future | None = None
        self._follower: asyncio.Task | None = None
        self._failed: BaseException | None = None
        self._producer = self._consumer = None

    async def open(self) -> None:
        """Create the topics if missing and read both to their end (once; every caller waits)."""
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._open())
        await asyncio.shield(self._opening)
        if self._failed is not None:
            raise JudgeLedgerError(f"{self.budget_topic}: the reader stopped: {self._failed!r}")

    async def _open(self) -> None:
        from aiokafka import TopicPartition

        await asyncio.to_thread(ensure_topics, self.bootstrap, self.specs)
        self._producer = make_async_producer(self.bootstrap, self.client_id)
        await self._producer.start()
        self._consumer = make_async_consumer(self.bootstrap, self.client_id)
        await self._consumer.start()
        parts = [TopicPartition(self.budget_topic, 0), TopicPartition(self.cache_topic, 0)]
        async for record in iter_range_async(self._consumer, parts):
            self._apply(record.topic, record)
        self._follower = asyncio.ensure_future(self._follow())
        log.info(
            "judge ledger: read %s and %s to their end (spend now %s, %d cached replies)",
            self.budget_topic,
            self.cache_topic,
            {k: round(v, 6) for k, v in self.book.spent_at(utc_now()).items()},
            len(self.replies),
        )

    def _apply(self, topic: str, message) -> None:
        if topic == self.cache_topic:
            if message.key is not None and message.value is not None:
                self.replies.put(message.key.decode(), message.value.decode())
            return
        try:
            record = orjson.loads(message.value)
            retry_at = self.book.apply(record)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            log.error("%s[0]@%d: unreadable budget record skipped: %r", topic, message.offset, exc)
            return
        if record.get("op") != "reserve":
            self.settled.set()
            return
        waiter = self._waiters.pop(record.get("id"), None)
        if waiter is not None and not waiter.done():
            waiter.set_result((retry_at, retry_at is not None and self.book.waitable))

    async def _follow(self) -> None:
        try:
            async for record in follow_async(self._consumer):
                self._apply(record.topic, record)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the broker went away for good: every waiter fails, the batch exits
            log.error("judge ledger: reading %s failed: %r", self.budget_topic, exc)
            self._failed = exc
            for waiter in self._waiters.values():
                if not waiter.done():
                    waiter.set_exception(JudgeLedgerError(f"{self.budget_topic}: reader failed: {exc!r}"))

    async def reserve(
        self, amount: float, window_caps: dict[str, float], now: datetime, hold_s: float | None = None
    ) -> Reservation:
        """Publish a reservation and return the book's decision on it, once it is read back."""
        await self.open()
        rid = new_reservation_id()
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[rid] = waiter
        record = reserve_record(rid, amount, now, window_caps, hold_s)
        try:
            retry_at, waitable = await asyncio.wait_for(self._send_and_decide(record, waiter), self.timeout_s)
        except TimeoutError:
            raise JudgeLedgerError(
                f"{self.budget_topic}: reservation {rid} not read back within {self.timeout_s}s"
            ) from None
        finally:
            self._waiters.pop(rid, None)
        return Reservation(rid, amount, retry_at, waitable)

    async def _send_and_decide(self, record: dict, waiter: asyncio.Future) -> tuple[datetime | None, bool]:
        await self._producer.send_and_wait(
            self.budget_topic, orjson.dumps(record), key=BUDGET_KEY, partition=0
        )
        return await waiter

    async def settle(self, reservation: Reservation, actual: float) -> None:
        await self._send(self.budget_topic, BUDGET_KEY, orjson.dumps(settle_record(reservation.id, actual)))

    async def store_reply(self, key: str, text: str) -> None:
        """Publish a reply (acknowledged before this returns) and keep it in memory."""
        await self._send(self.cache_topic, key.encode(), text.encode())
        self.replies.put(key, text)

    async def _send(self, topic: str, key: bytes, value: bytes) -> None:
        await self.open()
        try:
            await asyncio.wait_for(
                self._producer.send_and_wait(topic, value, key=key, partition=0), self.timeout_s
            )
        except TimeoutError:
            raise JudgeLedgerError(
                f"{topic}: a record was not acknowledged within {self.timeout_s}s"
            ) from None

    async def close(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
        for client in (self._consumer, self._producer):
            if client is not None:
                try:
                    await client.stop()
                except Exception as exc:  # stopping: nothing left to protect
                    log.warning("judge ledger: closing %s: %r", type(client).__name__, exc)


class SharedBudget:
    """The spend budget on the ledger (same interface as `budget.SpendBudget`)."""

    def __init__(
        self,
        ledger: JudgeLedger,
        per_hour: float | None,
        per_day: float | None,
        clock: Callable[[], datetime] = utc_now,
    ):
        self.ledger, self.caps, self.clock = ledger, caps(per_hour, per_day), clock

    @property
    def enabled(self) -> bool:
        return bool(self.caps)

    async def open(self) -> None:
        await self.ledger.open()

    async def reserve(self, amount: float, hold_s: float | None = None) -> Reservation:
        return await self.ledger.reserve(amount, self.caps, self.clock(), hold_s)

    async def settle(self, reservation: Reservation, actual: float) -> None:
        await self.ledger.settle(reservation, actual)

    async def wait_settled(self, timeout_s: float) -> None:
        await wait_event(self.ledger.settled, timeout_s)

    def spent(self) -> dict[str, float]:
        return self.ledger.book.spent_at(self.clock())


class SharedReplyCache(ReplyCache):
    """The reply cache on the ledger: the ledger fills it from the topic (every replica's replies,
    and those from before a restart); `store` publishes before it returns."""

    def __init__(self, ledger: JudgeLedger):
        super().__init__(ledger.replies.max_entries)
        ledger.replies = self
        self.ledger = ledger

    async def open(self) -> None:
        await self.ledger.open()

    async def store(self, key: str, text: str) -> None:
        await self.ledger.store_reply(key, text)


def share_state(
    app,
    processor,
    prefix: str | None = None,
    *,
    clock: Callable[[], datetime] | None = None,
) -> JudgeLedger:
    """Give a judge processor registered on the faust `app` the shared budget and reply cache
    (topics `<prefix>-budget` / `<prefix>-cache`, `LEDGER_PREFIX` when None, on the app's broker;
    not named after the app id, so a replay's judge shares them with the live one). Opened on the
    first call, closed when the app shuts down. `clock` (tests) sets the budget's time."""
    config = processor.config
    bootstrap = ",".join(f"{url.host}:{url.port}" for url in app.conf.broker)
    ledger = JudgeLedger(bootstrap, prefix or LEDGER_PREFIX, cache_entries=config.cache_entries)
    processor.calls.budget = SharedBudget(
        ledger, config.budget_usd_per_hour, config.budget_usd_per_day, clock or utc_now
    )
    if config.cache_entries > 0:
        processor.calls.cache = SharedReplyCache(ledger)

    async def close_ledger(sender=None, **_kwargs) -> None:
        await ledger.close()

    app.on_before_shutdown.connect(close_ledger, weak=False)
    return ledger

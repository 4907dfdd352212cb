"""Backpressure: the rollout pauses while the trainer is too far behind, instead of sampling data
that would be dropped as stale.

Staleness here is counted in batches not yet trained: the records on `training.batches` (one
`batch.built` per batch the trainer consumer wrote) minus the batches trained, which is the number
of the current policy (`clients.current_policy`: the executor names the version made by its n-th
trained batch `v<n>`, so `v7` current means 7 batches trained; `base`, an unknown-format version or
no policy count 0). This is how many policy versions the data already sampled is ahead of the policy
being served. Sampling pauses while it is above `max_staleness` and resumes once it is back at or
below it.

Batches are the `batch.built` records of the topic: since 1.5 a batch's rows travel before it as
`batch.rows` chunks, so its record count is not its batch count. `BuiltOffsets` reads each record
once (from where the last read stopped to the end) and keeps only the offsets of the `batch.built`
ones. A batch the executor finished without a version (no rows, or every group too stale) publishes
nothing on `policy.updates`, but the executor commits its offset all the same: the batches handled
are the more of the current policy's number and the `batch.built` records before the executor
group's committed offsets on `training.batches`, so such a batch never holds the rollout back for
good. Batches of a kind no executor trains keep the
count high (run the trainer with the kinds that are trained).

`should_pause` is the pure decision; `TopicBacklog` reads the offsets; `BackpressureGate` waits.
It must never stop the rollout on a broker error: an unreadable backlog does not pause.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field

import orjson

from clients.current_policy import CurrentPolicyReader
from clients.kafka import make_consumer
from clients.kafka.ranges import iter_range, topic_partitions
from schemas.policy_versions import version_number
from schemas.topics import TRAINING_BATCHES

log = logging.getLogger(__name__)


def staleness(batches: int, updates: int) -> int:
    """Batches built but not yet trained (never negative).

    >>> staleness(7, 4), staleness(2, 5)
    (3, 0)
    """
    return max(0, batches - updates)


def should_pause(batches: int, updates: int, max_staleness: int) -> bool:
    """True while more than `max_staleness` batches wait for training; `max_staleness` 0 is off.

    >>> should_pause(7, 4, 2), should_pause(6, 4, 2), should_pause(99, 0, 0)
    (True, False, False)
    """
    return max_staleness > 0 and staleness(batches, updates) > max_staleness


def trained_batches(current) -> int:
    """Batches trained by the time the `current` policy (a `PolicyUpdated` or None) was made: its
    version number (`v7` -> 7); 0 for none, `base` or an unknown-format version.

    >>> trained_batches(None)
    0
    """
    number = version_number(current.policy_version) if current is not None else None
    return number or 0


@dataclass(frozen=True)
class Backlog:
    batches: int
    updates: int


def is_batch_built(value: bytes | None) -> bool:
    """Whether a record of `training.batches` is a `batch.built` (not a `batch.rows` chunk; an
    unreadable record is no batch).

    >>> is_batch_built(b'{"type": "batch.built"}'), is_batch_built(b'{"type": "batch.rows"}')
    (True, False)
    >>> is_batch_built(b"{"), is_batch_built(None)
    (False, False)
    """
    try:
        event = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return False
    return isinstance(event, dict) and event.get("type") == "batch.built"


@dataclass
class BuiltOffsets:
    """The offsets of the `batch.built` records of each partition read so far, and where the next
    read starts; records below the topic's beginning (retention) are forgotten."""

    position: dict = field(default_factory=dict)  # TopicPartition -> next offset to read
    built: dict = field(default_factory=dict)  # TopicPartition -> sorted offsets of batch.built

    def read(self, consumer, parts: list, begins: dict, timeout_s: float) -> None:
        """Read every partition from its position to its end now (within `timeout_s`; the rest next time)."""
        start = {p: max(self.position.get(p, begins[p]), begins[p]) for p in parts}
        for p in parts:
            kept = self.built.get(p, [])
            self.built[p] = kept[bisect_left(kept, begins[p]) :]
        by_partition = {(p.topic, p.partition): p for p in parts}
        for record in iter_range(consumer, parts, start, timeout_s=timeout_s):
            tp = by_partition[(record.topic, record.partition)]
            if is_batch_built(record.value):
                self.built[tp].append(record.offset)
        for p in parts:  # every record below the consumer's position was handed out above
            self.position[p] = consumer.position(p)

    def count(self, p, below: int | None = None) -> int:
        """`batch.built` records of `p` (below offset `below`, when given)."""
        kept = self.built.get(p, [])
        return len(kept) if below is None else bisect_left(kept, below)


class TopicBacklog:
    """Counts the records of `training.batches` from their offsets, the batches `executor_group` has
    committed (it never joins that group: it only reads its offsets) and the batches the current
    policy was trained on (its version number)."""

    def __init__(
        self, bootstrap_servers: str, timeout_ms: int = 5000, executor_group: str = "agentstream-executor"
    ):
        self.bootstrap_servers, self.timeout_ms = bootstrap_servers, timeout_ms
        self.executor_group = executor_group
        self._consumer = None
        self._reader = None  # no group: reads the records, commits nothing
        self._built = BuiltOffsets()
        self._policies = CurrentPolicyReader(
            bootstrap_servers, timeout_ms / 1000, "agentstream-rollout-backpressure"
        )

    def read(self) -> Backlog:
        if self._consumer is None:
            self._consumer = make_consumer(
                self.bootstrap_servers,
                "agentstream-rollout-backpressure",
                self.executor_group,
                bootstrap_timeout_ms=self.timeout_ms,
                request_timeout_ms=self.timeout_ms,
            )
        if self._reader is None:
            self._reader = make_consumer(
                self.bootstrap_servers,
                "agentstream-rollout-backpressure",
                bootstrap_timeout_ms=self.timeout_ms,
                request_timeout_ms=self.timeout_ms,
            )
        batches, committed = self._count_batches()
        return Backlog(batches, max(trained_batches(self._policies.current()), committed))

    def _count_batches(self) -> tuple[int, int]:
        """(`batch.built` records on `training.batches`, those before the executor group's committed
        offsets)."""
        consumer = self._consumer
        parts = topic_partitions(consumer, [TRAINING_BATCHES])
        if not parts:
            return 0, 0
        begins = consumer.beginning_offsets(parts)
        self._built.read(self._reader, parts, begins, self.timeout_ms / 1000)
        total = sum(self._built.count(p) for p in parts)
        done = {p: consumer.committed(p) for p in parts}
        return total, sum(self._built.count(p, c) for p, c in done.items() if c is not None)

    def close(self) -> None:
        self._policies.close()
        for client in (self._consumer, self._reader):
            if client is not None:
                client.close()
        self._consumer = self._reader = None


class BackpressureGate:
    """`wait()` returns once the trainer is at most `max_staleness` batches behind and, with
    `max_ahead`, fewer than `max_ahead` episodes have started since the executor last finished a
    batch; it re-checks every `poll_s` seconds, one log line per pause. Thread-safe (every episode
    waits on it).

    `max_ahead` bounds what is sampled before the pipeline catches up: batches are counted only once
    the trainer has built them, so before the first batch (or while the stream workers lag) the
    staleness count alone lets a fast rollout sample thousands of episodes with one version.
    """

    def __init__(
        self, backlog, max_staleness: int, poll_s: float = 5.0, sleep=time.sleep, max_ahead: int = 0
    ):
        self.backlog, self.max_staleness, self.poll_s, self.sleep = backlog, max_staleness, poll_s, sleep
        self.max_ahead = max_ahead
        self.paused = False
        self.pauses = 0
        self._handled: int | None = None
        self._started = 0
        self._lock = threading.Lock()

    def check(self, claim: bool = False) -> bool:
        """Read the backlog once; True when sampling should pause now. `claim`: when it need not,
        count one more episode started."""
        with self._lock:
            try:
                backlog = self.backlog.read()
            except Exception as exc:  # an unknown backlog never blocks sampling
                log.warning("rollout: cannot read the training backlog (%r); not pausing", exc)
                return self._set(False, "backlog unknown")
            if backlog.updates != self._handled:  # the executor finished a batch: a new allowance
                self._handled, self._started = backlog.updates, 0
            behind = staleness(backlog.batches, backlog.updates)
            ahead = self.max_ahead > 0 and self._started >= self.max_ahead
            pause = should_pause(backlog.batches, backlog.updates, self.max_staleness) or ahead
            if claim and not pause:
                self._started += 1
            return self._set(
                pause,
                f"trainer {behind} batches behind (max_staleness {self.max_staleness}), "
                f"{self._started} episodes since its last batch (max_ahead {self.max_ahead})",
            )

    def _set(self, pause: bool, why: str) -> bool:
        if pause and not self.paused:
            self.pauses += 1
            log.info("rollout: paused, %s", why)
        elif self.paused and not pause:
            log.info("rollout: resumed, %s", why)
        self.paused = pause
        return pause

    def wait(self) -> None:
        """Block while paused (no-op when `max_staleness` and `max_ahead` are 0), then count the
        episode about to start."""
        if self.max_staleness <= 0 and self.max_ahead <= 0:
            return
        while self.check(claim=True):
            self.sleep(self.poll_s)

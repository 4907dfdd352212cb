"""Backpressure: the rollout pauses while the trainer is too far behind, instead of sampling data
that would be dropped as stale.

Staleness here is counted in batches not yet trained: the records on `training.batches` (one
`batch.built` per batch the trainer consumer wrote) minus the records on `policy.updates` (one
`policy.updated` per batch the executor trained on). Every new policy version is one trained batch,
so this is how many policy versions the data already sampled is ahead of the policy being served.
Sampling pauses while it is above `max_staleness` and resumes once it is back at or below it.

The count comes from the two topics' offsets (end minus beginning), not from reading them. A batch
the executor finished without a version (no rows, or every group too stale) publishes nothing on
`policy.updates`, but the executor commits its offset all the same: the batches handled are the more
of the updates and the executor group's committed offsets on `training.batches`, so such a batch
never holds the rollout back for good. Batches of a kind no executor trains keep the count high (run
the trainer with the kinds that are trained).

`should_pause` is the pure decision; `TopicBacklog` reads the offsets; `BackpressureGate` waits.
It must never stop the rollout on a broker error: an unreadable backlog does not pause.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from clients.kafka import make_consumer
from schemas.topics import POLICY_UPDATES, TRAINING_BATCHES

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


@dataclass(frozen=True)
class Backlog:
    batches: int
    updates: int


class TopicBacklog:
    """Counts the records of `training.batches` and `policy.updates` from their offsets, and the
    batches `executor_group` has committed (it never joins that group: it only reads its offsets)."""

    def __init__(
        self, bootstrap_servers: str, timeout_ms: int = 5000, executor_group: str = "agentstream-executor"
    ):
        self.bootstrap_servers, self.timeout_ms = bootstrap_servers, timeout_ms
        self.executor_group = executor_group
        self._consumer = None

    def read(self) -> Backlog:
        if self._consumer is None:
            self._consumer = make_consumer(
                self.bootstrap_servers,
                "agentstream-rollout-backpressure",
                self.executor_group,
                bootstrap_timeout_ms=self.timeout_ms,
                request_timeout_ms=self.timeout_ms,
            )
        batches, committed = self._count(TRAINING_BATCHES, committed=True)
        updates, _ = self._count(POLICY_UPDATES)
        return Backlog(batches, max(updates, committed))

    def _count(self, topic: str, committed: bool = False) -> tuple[int, int]:
        """(records on `topic`, records before the executor group's committed offsets)."""
        from kafka import TopicPartition

        consumer = self._consumer
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not parts:
            return 0, 0
        ends, begins = consumer.end_offsets(parts), consumer.beginning_offsets(parts)
        total = sum(ends[p] - begins[p] for p in parts)
        if not committed:
            return total, 0
        done = {p: consumer.committed(p) for p in parts}
        return total, sum(max(0, c - begins[p]) for p, c in done.items() if c is not None)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


class BackpressureGate:
    """`wait()` returns once the trainer is at most `max_staleness` batches behind, re-checking every
    `poll_s` seconds; one log line per pause. Thread-safe (every episode waits on it)."""

    def __init__(self, backlog, max_staleness: int, poll_s: float = 5.0, sleep=time.sleep):
        self.backlog, self.max_staleness, self.poll_s, self.sleep = backlog, max_staleness, poll_s, sleep
        self.paused = False
        self.pauses = 0
        self._lock = threading.Lock()

    def check(self) -> bool:
        """Read the backlog once; True when sampling should pause now."""
        with self._lock:
            try:
                backlog = self.backlog.read()
            except Exception as exc:  # an unknown backlog never blocks sampling
                log.warning("rollout: cannot read the training backlog (%r); not pausing", exc)
                return self._set(False, 0)
            pause = should_pause(backlog.batches, backlog.updates, self.max_staleness)
            return self._set(pause, staleness(backlog.batches, backlog.updates))

    def _set(self, pause: bool, behind: int) -> bool:
        if pause and not self.paused:
            self.pauses += 1
            log.info(
                "rollout: paused, trainer %d batches behind (max_staleness %d)", behind, self.max_staleness
            )
        elif self.paused and not pause:
            log.info(
                "rollout: resumed, trainer %d batches behind (max_staleness %d)", behind, self.max_staleness
            )
        self.paused = pause
        return pause

    def wait(self) -> None:
        """Block while paused (no-op when `max_staleness` is 0)."""
        if self.max_staleness <= 0:
            return
        while self.check():
            self.sleep(self.poll_s)

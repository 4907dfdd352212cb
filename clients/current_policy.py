"""The one reader of "which policy is current": reads `policy.updates` (every partition) to its end
and applies `schemas.policy_versions` (the newest `policy.updated` by version order).

Every component that needs the current policy asks this reader (the policy server's reloader, the
rollout's horizon and backpressure, the SDK's follower, learn). The batch builder (`agentstream
batch`), which reads the topic in its own loop, folds what it reads with the same
`schemas.policy_versions.newer`. The training executor does not ask: it numbers the versions it
publishes itself (its checkpointed version counter, `consumers.training.versions`).

A reader remembers where it stopped and the newest event so far, so a repeated `current()` reads
only what arrived since; a new reader (a restart) reads from the beginning and reaches the same
answer. Reads go through `clients.kafka` (its factory and `ranges.iter_range`); this module holds
no poll loop of its own.

A version the evaluation gate refused (`gate == "refused"`, since schema 1.5; `agentstream train
--gate`) is skipped: it stays on the topic and in the lineage, but never becomes current, so the
version serving before it stays current. The batch builder's own fold still counts it (it is the
executor's weights, what GRPO staleness is measured against).

A record that does not decode, or is not a `policy.updated`, is skipped with one error line naming
its coordinates; an unknown-format version is logged once (it is current only while no numbered
version exists, see `schemas.policy_versions`).
"""

from __future__ import annotations

import logging
import threading

from clients.kafka import make_consumer
from clients.kafka.ranges import iter_range, topic_partitions
from schemas.codec import decode
from schemas.errors import DecodeError
from schemas.events import PolicyUpdated
from schemas.policy_versions import newer, version_number
from schemas.records import Record
from schemas.topics import POLICY_UPDATES

log = logging.getLogger(__name__)


class CurrentPolicyReader:
    """`current()`: the current policy on `policy.updates` (None while there is none).

    `timeout_s` bounds each read, connecting included (kafka-python would wait 30 s for an absent
    broker). A read that fails raises; the reader drops its connection and starts over on the next
    call (the answer so far is kept: re-reading can only confirm it or find a newer one).
    Thread-safe.
    """

    def __init__(
        self, bootstrap_servers: str, timeout_s: float = 5.0, client_id: str = "agentstream-current-policy"
    ):
        self.bootstrap_servers, self.timeout_s, self.client_id = bootstrap_servers, timeout_s, client_id
        self._current: PolicyUpdated | None = None
        self._next: dict = {}  # TopicPartition -> next offset to read
        self._consumer = None
        self._unknown_logged: set[str] = set()
        self._lock = threading.Lock()

    def current(self) -> PolicyUpdated | None:
        """Read what arrived since the last call up to the end offsets now; the current policy."""
        with self._lock:
            try:
                for record in self._read_new():
                    self._fold(record)
            except Exception:
                self._close()
                raise
            return self._current

    def _read_new(self):
        if self._consumer is None:
            timeout_ms = int(self.timeout_s * 1000)
            self._consumer = make_consumer(
                self.bootstrap_servers,
                self.client_id,
                bootstrap_timeout_ms=timeout_ms,
                request_timeout_ms=timeout_ms + 1000,
            )
        parts = topic_partitions(self._consumer, [POLICY_UPDATES])
        if not parts:
            return
        fresh = [tp for tp in parts if tp not in self._next]
        if fresh:
            self._next.update(self._consumer.beginning_offsets(fresh))
        by_coordinates = {(tp.topic, tp.partition): tp for tp in parts}
        for record in iter_range(self._consumer, parts, dict(self._next), timeout_s=self.timeout_s):
            self._next[by_coordinates[(record.topic, record.partition)]] = record.offset + 1
            yield record

    def _fold(self, record: Record) -> None:
        try:
            event = decode(record.value or b"")
        except DecodeError as exc:
            log.error("current policy: skipping unreadable record %s: %s", record.describe(), exc)
            return
        if not isinstance(event, PolicyUpdated):
            log.error("current policy: skipping %s at %s (not policy.updated)", event.type, record.describe())
            return
        version = event.policy_version
        if event.gate == "refused":  # the evaluation gate refused it: recorded, never served
            log.info(
                "current policy: %s at %s was refused by the gate; not current", version, record.describe()
            )
            return
        if version_number(version) is None and version not in self._unknown_logged:
            self._unknown_logged.add(version)
            log.warning(
                "current policy: version %r at %s has no number; it ranks below every numbered version",
                version,
                record.describe(),
            )
        self._current = newer(self._current, event)

    def _close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            finally:
                self._consumer = None

    def close(self) -> None:
        with self._lock:
            self._close()

    def __enter__(self) -> CurrentPolicyReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def read_current_policy(bootstrap_servers: str, timeout_s: float = 5.0) -> PolicyUpdated | None:
    """The current policy on `policy.updates`, read once from the beginning."""
    with CurrentPolicyReader(bootstrap_servers, timeout_s) as reader:
        return reader.current()

"""Hot reload: follow `policy.updates` and serve each new version.

A thread reads `policy.updated` events from the end of the topic (from the offset it had at start,
so an update published while the server starts is not missed). For each one it loads the new
adapter beside the engine serving now (`engine.with_adapter`), then swaps it in: requests already
running finish on the old version, new ones get the new one, so no response mixes versions and
nothing waits for the load. A missing or corrupt checkpoint keeps the old version serving and logs
one error naming the path. `reload_pauses_ms` records the time each swap held the service.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from clients.kafka import make_consumer
from producers.errors import ProducerError
from schemas.codec import decode
from schemas.errors import DecodeError
from schemas.events import PolicyUpdated
from schemas.topics import POLICY_UPDATES

log = logging.getLogger(__name__)


class PolicyReloader:
    """Follows `policy.updates` for `service` until `stop()`."""

    def __init__(self, service, bootstrap_servers: str, poll_ms: int = 200):
        self.service, self.bootstrap_servers, self.poll_ms = service, bootstrap_servers, poll_ms
        self.reload_pauses_ms: list[float] = []
        self.load_times_ms: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentstream-policy-reload", daemon=True)

    def start(self, timeout_s: float = 30.0) -> PolicyReloader:
        """Start following; returns once positioned at the topic's end (or after `timeout_s`)."""
        self._thread.start()
        self._ready.wait(timeout_s)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        from kafka import TopicPartition

        consumer = make_consumer(self.bootstrap_servers, "agentstream-policy-reload")
        try:
            parts = [
                TopicPartition(POLICY_UPDATES, p)
                for p in sorted(consumer.partitions_for_topic(POLICY_UPDATES) or {0})
            ]
            consumer.assign(parts)
            consumer.seek_to_end(*parts)
            for part in parts:
                consumer.position(part)  # resolve the end offset now, before answering ready
            self._ready.set()
            while not self._stop.is_set():
                for records in consumer.poll(timeout_ms=self.poll_ms).values():
                    for record in records:
                        self._on_record(record.value)
        except Exception as exc:  # the reloader must never take the server down
            log.error("policy reload: stopped following %s: %r", POLICY_UPDATES, exc)
        finally:
            self._ready.set()
            consumer.close()

    def _on_record(self, value: bytes | None) -> None:
        try:
            event = decode(value or b"")
        except DecodeError as exc:
            log.error("policy reload: unreadable record on %s: %s", POLICY_UPDATES, exc)
            return
        if isinstance(event, PolicyUpdated):
            self.apply(event)

    def apply(self, event: PolicyUpdated) -> bool:
        """Load `event`'s checkpoint and serve it; False (old version kept, one error logged) when
        it cannot be loaded."""
        if event.policy_version == self.service.engine.version:
            return True
        started = time.perf_counter()
        try:
            engine = self.service.engine.with_adapter(Path(event.checkpoint_path), event.policy_version)
        except ProducerError as exc:
            self.failures.append(event.policy_version)
            log.error(
                "policy reload: %s not served (%s); still serving %s",
                event.policy_version,
                exc,
                self.service.engine.version,
            )
            return False
        loaded = time.perf_counter()
        self.service.swap(engine)
        self.load_times_ms.append((loaded - started) * 1000.0)
        self.reload_pauses_ms.append((time.perf_counter() - loaded) * 1000.0)
        return True

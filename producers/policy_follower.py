"""Which policy version new episodes get when a recorder follows `policy.updates`."""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)


class PolicyFollower:
    """The newest `policy_version` on `policy.updates` (a 1-partition topic: its last record),
    cached for `ttl_s`. The first lookup waits for the broker (up to `timeout_ms`); later ones
    answer from the cache at once and refresh it in a background thread when it is stale, so an
    unreachable broker never holds up `rec.episode()`. A failed refresh keeps the previous answer."""

    def __init__(self, bootstrap_servers: str, ttl_s: float = 5.0, timeout_ms: int = 2000):
        self.bootstrap_servers = bootstrap_servers
        self.ttl_s = ttl_s
        self.timeout_ms = timeout_ms
        self._value: str | None = None
        self._checked_at: float | None = None
        self._refreshing = False
        self._lock = threading.Lock()

    def latest(self) -> str | None:
        with self._lock:
            first = self._checked_at is None
            stale = first or time.monotonic() - self._checked_at >= self.ttl_s
            start_refresh = stale and not self._refreshing
            if start_refresh:
                self._refreshing = True
        if first and start_refresh:
            self._refresh()
        elif start_refresh:
            threading.Thread(target=self._refresh, name="agentstream-policy", daemon=True).start()
        return self._value

    def _refresh(self) -> None:
        try:
            value = self._read_last()
        except Exception as exc:
            log.warning("cannot read policy.updates from %s: %s", self.bootstrap_servers, exc)
            value = None
        with self._lock:
            self._value = value or self._value
            self._checked_at = time.monotonic()
            self._refreshing = False

    def _read_last(self) -> str | None:
        from kafka import TopicPartition

        from clients.kafka import make_consumer
        from schemas.codec import decode
        from schemas.topics import POLICY_UPDATES

        consumer = make_consumer(
            self.bootstrap_servers,
            "agentstream-policy-follower",
            bootstrap_timeout_ms=self.timeout_ms,
            request_timeout_ms=self.timeout_ms + 1000,
        )
        try:
            tp = TopicPartition(POLICY_UPDATES, 0)
            if not consumer.partitions_for_topic(POLICY_UPDATES):
                return None
            end = consumer.end_offsets([tp])[tp]
            if end == 0:
                return None
            consumer.assign([tp])
            consumer.seek(tp, end - 1)
            deadline = time.monotonic() + self.timeout_ms / 1000
            while time.monotonic() < deadline:
                records = consumer.poll(timeout_ms=200).get(tp, [])
                if records:
                    return getattr(decode(records[-1].value), "policy_version", None)
            return None
        finally:
            consumer.close()

"""Which policy version new episodes get when a recorder follows `policy.updates`: the current
policy as `clients.current_policy` defines it (never a reading of its own)."""

from __future__ import annotations

import logging
import threading
import time

from clients.current_policy import read_current_policy

log = logging.getLogger(__name__)


class PolicyFollower:
    """The current policy's version (`clients.current_policy`), cached for `ttl_s`. The first
    lookup waits for the broker (up to `timeout_ms`); later ones answer from the cache at once and
    refresh it in a background thread when it is stale, so an unreachable broker never holds up
    `rec.episode()`. A failed refresh keeps the previous answer."""

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
            value = self._read_current()
        except Exception as exc:
            log.warning("cannot read policy.updates from %s: %s", self.bootstrap_servers, exc)
            value = None
        with self._lock:
            self._value = value or self._value
            self._checked_at = time.monotonic()
            self._refreshing = False

    def _read_current(self) -> str | None:
        # A fresh read each refresh (the topic is small) rather than a consumer held open for the
        # life of the recorder, which has no hook to close it.
        current = read_current_policy(self.bootstrap_servers, self.timeout_ms / 1000)
        return current.policy_version if current is not None else None

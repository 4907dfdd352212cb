"""Hot reload: serve the current policy, as `clients.current_policy` defines it.

A thread asks the current-policy reader every `poll_s` seconds (the first time at start, so a
server started after updates were published serves the current one, not its start-up adapter). When
the current policy is an event it has not tried yet, it loads that adapter beside the engine serving
now (`engine.with_adapter`), then swaps it in: requests already running finish on the old version,
new ones get the new one, so no response mixes versions and nothing waits for the load. An update
that is not the current policy (an older version published late) is never loaded. A missing or
corrupt checkpoint keeps the old version serving and logs one error naming the path (it is not
retried; a newer update is). `reload_pauses_ms` records the time each swap held the service.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from clients.current_policy import CurrentPolicyReader
from producers.errors import ProducerError
from schemas.events import PolicyUpdated
from schemas.topics import POLICY_UPDATES

log = logging.getLogger(__name__)


class PolicyReloader:
    """Serves the current policy for `service` until `stop()`."""

    def __init__(self, service, bootstrap_servers: str, poll_s: float = 1.0):
        self.service, self.bootstrap_servers, self.poll_s = service, bootstrap_servers, poll_s
        self.reload_pauses_ms: list[float] = []
        self.load_times_ms: list[float] = []
        self.failures: list[str] = []
        self._tried: set[str] = set()  # event ids of current policies already applied or refused
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentstream-policy-reload", daemon=True)

    def start(self, timeout_s: float = 30.0) -> PolicyReloader:
        """Start following; returns once the current policy at start is served (or could not be
        read or loaded), or after `timeout_s`."""
        self._thread.start()
        self._ready.wait(timeout_s)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        reader = CurrentPolicyReader(self.bootstrap_servers, client_id="agentstream-policy-reload")
        unreachable = False
        try:
            while not self._stop.is_set():
                try:
                    current = reader.current()
                    unreachable = False
                except Exception as exc:  # the broker may come back: keep serving, ask again
                    if not unreachable:
                        log.warning("policy reload: cannot read %s (%r); still serving", POLICY_UPDATES, exc)
                    current, unreachable = None, True
                self.serve_current(current)
                self._ready.set()  # after the first load: the server's first answer is the current policy
                self._stop.wait(self.poll_s)
        except Exception as exc:  # the reloader must never take the server down
            log.error("policy reload: stopped following %s: %r", POLICY_UPDATES, exc)
        finally:
            self._ready.set()
            reader.close()

    def serve_current(self, current: PolicyUpdated | None) -> None:
        """Apply `current` unless it was tried already (each event is loaded at most once)."""
        if current is None or current.event_id in self._tried:
            return
        self._tried.add(current.event_id)
        self.apply(current)

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

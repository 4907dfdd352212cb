"""Hot reload: serve the current policy, as `clients.current_policy` defines it.

A thread asks the current-policy reader every `poll_s` seconds (the first time at start, so a
server started after updates were published serves the current one, not its start-up version). When
the current policy is an event it has not tried yet, it loads that checkpoint beside the engine
serving now (`engine.with_checkpoint`: a LoRA adapter or a full fine-tune), then swaps it in:
requests already running finish on the old version, new ones get the new one, so no response mixes
versions and nothing waits for the load. An update that is not the current policy (an older version
published late) is never loaded. Each event is tried once; a newer one is tried.

Refused, the old version serving on (one error line each, naming the version and why):
- a checkpoint that cannot be loaded (missing, corrupt, not a checkpoint): `failures`;
- a version built on another base model: its event's `base_model_id` or `tokenizer_hash`, when
  given, differs from the engine's (an engine whose `base_model_id` is "" does not know its base:
  that one is not compared): `refused`. The same shapes would load and serve wrong, silently.
`reload_pauses_ms` records the time each swap held the service.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from clients.current_policy import CurrentPolicyReader
from producers.errors import ProducerError
from producers.policy.engine.errors import one_line
from schemas.events import PolicyUpdated
from schemas.topics import POLICY_UPDATES

log = logging.getLogger(__name__)


def other_base(engine, base_model_id: str, tokenizer_hash: str) -> str | None:
    """Why a version trained on (`base_model_id`, `tokenizer_hash`) cannot be served by `engine`,
    naming both sides; None when it can. An empty value on either side is not compared.

    >>> class Engine: base_model_id, tokenizer_hash = "b1", "t1"
    >>> other_base(Engine(), "b1", ""), other_base(Engine(), "", "t1")
    (None, None)
    >>> other_base(Engine(), "b2", "t1")
    'built on another base: base_model_id b2 (this server: b1), tokenizer_hash t1 (this server: t1)'
    """
    ours_id, ours_hash = engine.base_model_id, engine.tokenizer_hash
    differs = (base_model_id and ours_id and base_model_id != ours_id) or (
        tokenizer_hash and ours_hash and tokenizer_hash != ours_hash
    )
    if not differs:
        return None
    return (
        f"built on another base: base_model_id {base_model_id or '(none)'} (this server: "
        f"{ours_id or '(unknown)'}), tokenizer_hash {tokenizer_hash or '(none)'} (this server: {ours_hash})"
    )


class PolicyReloader:
    """Serves the current policy for `service` until `stop()`."""

    def __init__(self, service, bootstrap_servers: str, poll_s: float = 1.0):
        self.service, self.bootstrap_servers, self.poll_s = service, bootstrap_servers, poll_s
        self.reload_pauses_ms: list[float] = []
        self.load_times_ms: list[float] = []
        self.failures: list[str] = []  # versions whose checkpoint could not be loaded
        self.refused: list[str] = []  # versions built on another base model
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
        it is built on another base or cannot be loaded."""
        serving = self.service.engine
        version = event.policy_version
        if version == serving.version:
            return True
        refusal = other_base(serving, event.base_model_id, event.tokenizer_hash)
        if refusal is not None:
            self.refused.append(version)
            log.error("policy reload: %s refused: %s; still serving %s", version, refusal, serving.version)
            return False
        started = time.perf_counter()
        try:
            if not event.checkpoint_path:
                raise ProducerError("checkpoint_path: empty in its policy.updated event")
            engine = serving.with_checkpoint(Path(event.checkpoint_path), version)
        except Exception as exc:  # whatever a checkpoint does to the loader, the old version serves on
            self.failures.append(version)
            reason = str(exc) if isinstance(exc, ProducerError) else one_line(exc)
            log.error("policy reload: %s not served (%s); still serving %s", version, reason, serving.version)
            return False
        loaded = time.perf_counter()
        self.service.swap(engine)
        self.load_times_ms.append((loaded - started) * 1000.0)
        self.reload_pauses_ms.append((time.perf_counter() - loaded) * 1000.0)
        return True

"""Which LoRA versions the proxy has loaded into its upstream, which requests use them, and which
can be unloaded: pure bookkeeping, the HTTP calls are the caller's (upstream.py).

Rules: the newest `keep` versions the proxy loaded stay loaded; an older one is unloaded once no
request is using it, and never while it is the version serving when the next one is loaded (the
service swaps to a new version only after it loaded, so the one serving then is still in use: it
goes at a later load). Adapters that were in the upstream before the proxy started (another
client's, or started with `--lora-modules`) are known, so loading the same name replaces it in
place, but never unloaded by the proxy.
"""

from __future__ import annotations

import threading
from collections import Counter


class LoadedVersions:
    """The proxy's adapters in its upstream, oldest first. Thread-safe.

    >>> versions = LoadedVersions(keep=2)
    >>> versions.added("v1", serving="base"), versions.added("v2", serving="v1")
    ([], [])
    >>> versions.enter("v1")
    True
    >>> versions.added("v3", serving="v2")  # v1 is in use: it goes when its request ends
    []
    >>> versions.leave("v1"), versions.loaded("v1"), versions.loaded("v3")
    (['v1'], False, True)
    """

    def __init__(self, keep: int, existing: tuple[str, ...] = ()):
        if keep < 1:
            raise ValueError(f"keep: expected at least 1, got {keep}")
        self.keep = keep
        self._lock = threading.Lock()
        self._ours: list[str] = []  # loaded by the proxy, oldest first
        self._others = set(existing)
        self._in_use: Counter[str] = Counter()
        self._retired: set[str] = set()  # over the window, unloaded when their last request ends
        self._gone: set[str] = set()  # unloaded by the proxy

    def loaded(self, name: str) -> bool:
        """Whether the upstream has an adapter called `name` (a load must then replace it in place)."""
        with self._lock:
            return name in self._others or name in self._ours

    def added(self, name: str, serving: str) -> list[str]:
        """`name` was just loaded while `serving` serves: the versions to unload now."""
        with self._lock:
            if name in self._ours:
                self._ours.remove(name)
            self._ours.append(name)
            self._retired.discard(name)
            self._gone.discard(name)
            old = [v for v in self._ours[: -self.keep] if v != serving]
            self._retired.update(old)
            return self._take_unused()

    def enter(self, name: str) -> bool:
        """A request on `name` starts; False (not counted) when `name` was unloaded already."""
        with self._lock:
            if name in self._gone:
                return False
            self._in_use[name] += 1
            return True

    def leave(self, name: str) -> list[str]:
        """A request on `name` ended: the versions to unload now."""
        with self._lock:
            self._in_use[name] -= 1
            if self._in_use[name] <= 0:
                del self._in_use[name]
            return self._take_unused()

    def _take_unused(self) -> list[str]:
        done = sorted(v for v in self._retired if not self._in_use[v])
        for name in done:
            self._retired.discard(name)
            self._ours.remove(name)
            self._gone.add(name)
        return done

"""Which sandbox backend to use: `make_sandbox`, in one documented order, saying what it chose.

`backend="auto"` tries, in this order, and takes the first that can give its isolation:

1. `local`: `LocalSandbox` in its own bubblewrap namespace (filesystem, network, processes,
   memory and disk isolated; a tool call costs a few milliseconds).
2. `docker`: `DockerSandbox` in a hardened container, when an engine answers and holds the sandbox
   image (`agentstream sandbox-engine up` starts a private one and builds the image).
3. Nothing: a `SandboxError` that names why each backend could not be had. Agent commands never
   run without isolation unless the caller says so with `unisolated=True` (for the `sandbox` env:
   `--env-args '{"unisolated": true}'`); then the local backend runs them on the host and logs, at WARNING,
   each isolation that is missing.

The choice is logged once per process and backend at INFO (with the isolation the sandbox has);
`box.isolation` says the same for each sandbox. It must not build either backend's machinery
itself: it only picks one and constructs it.
"""

from __future__ import annotations

import logging
from typing import Any

from producers.sandbox.base import Sandbox
from producers.sandbox.errors import SandboxError

__all__ = ["BACKENDS", "describe_isolation", "make_sandbox"]

log = logging.getLogger(__name__)

BACKENDS = ("auto", "local", "docker")
_announced: set[str] = set()


def make_sandbox(
    backend: str = "auto", *, limits: Any = None, docker: Any = None, unisolated: bool = False
) -> Sandbox:
    """A sandbox of `backend` ("auto", "local" or "docker"; see the module docstring for the order).

    `limits`: a `producers.sandbox.local.Limits` for the local backend; `docker`: a
    `producers.sandbox.docker.DockerConfig`; `unisolated`: allow the local backend to run agent
    commands on the host when bubblewrap cannot be had (never the default). A backend asked for by
    name that cannot be had raises `SandboxError` with its reason.
    """
    if backend not in BACKENDS:
        raise SandboxError(f"sandbox backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "local":
        return _announce(_local(limits, unisolated), "local")
    if backend == "docker":
        return _announce(_docker(docker), "docker")
    reasons = []
    for name, build in (("local", lambda: _local(limits, False)), ("docker", lambda: _docker(docker))):
        try:
            return _announce(build(), f"auto -> {name}")
        except SandboxError as exc:
            reasons.append(f"{name}: {exc}")
    if unisolated:
        return _announce(_local(limits, True), "auto -> local, unisolated")
    raise SandboxError(
        "no sandbox backend can isolate agent commands here; "
        + "; ".join(reasons)
        + ". Install bubblewrap (apt-get install bubblewrap), or start the private Docker engine "
        "(agentstream sandbox-engine up), or accept running agent commands on the host with "
        "unisolated=True (for the sandbox env: --env-args '{\"unisolated\": true}')"
    )


def describe_isolation(isolation: dict[str, Any]) -> str:
    """One line: what a sandbox's `isolation` dict enforces and what it lacks.

    >>> describe_isolation({"backend": "local", "filesystem": True, "network": False, "missing": ["network"]})
    'filesystem isolated; network NOT isolated; missing: network'
    """
    parts = []
    for key in ("filesystem", "network", "processes", "memory", "disk"):
        if key in isolation:
            parts.append(f"{key} {'isolated' if isolation[key] else 'NOT isolated'}")
    missing = isolation.get("missing") or []
    return "; ".join(parts) + (f"; missing: {', '.join(missing)}" if missing else "")


def _local(limits: Any, unisolated: bool) -> Sandbox:
    from producers.sandbox.local import Limits, LocalSandbox

    return LocalSandbox(limits if limits is not None else Limits(), unisolated=unisolated)


def _docker(config: Any) -> Sandbox:
    from producers.sandbox.docker import DockerConfig, DockerSandbox

    return DockerSandbox(config if config is not None else DockerConfig())


def _announce(box: Sandbox, how: str) -> Sandbox:
    """Log, once per process and choice, which backend was chosen and what it isolates."""
    isolation = getattr(box, "isolation", {}) or {}
    if how not in _announced:
        _announced.add(how)
        level = logging.WARNING if isolation.get("missing") else logging.INFO
        log.log(level, "sandbox backend %s: %s", how, describe_isolation(isolation))
    return box

"""Which sandbox backend to use: `make_sandbox` and the engine probe it relies on.

It must not build either backend's machinery itself: it only picks one and constructs it.
"""

from __future__ import annotations

import logging
from typing import Any

from producers.sandbox.base import Sandbox
from producers.sandbox.errors import SandboxError

__all__ = ["docker_unavailable_reason", "make_sandbox"]

log = logging.getLogger(__name__)


def docker_unavailable_reason(ping_timeout_s: float = 2.0) -> str | None:
    """None when a Docker engine answers a ping within the timeout, else why not."""
    try:
        import docker
    except ImportError:
        return "the `docker` package is not installed (pip install 'agentstream[dev]')"
    try:
        docker.from_env(timeout=ping_timeout_s).ping()
    except Exception as exc:  # the SDK raises many kinds for "no engine": report, do not crash
        return f"no Docker engine reachable: {type(exc).__name__}: {exc}"
    return None


def make_sandbox(backend: str = "auto", **kwargs: Any) -> Sandbox:
    """A `DockerSandbox` when asked for (or "auto") and an engine answers in 2 s, else local.

    `backend="docker"` without an engine raises `SandboxError` with the reason.
    """
    if backend not in ("auto", "local", "docker"):
        raise SandboxError(f"sandbox backend must be 'auto', 'local' or 'docker', got {backend!r}")
    if backend != "local":
        reason = docker_unavailable_reason()
        if reason is None:
            from producers.sandbox.docker import DockerSandbox

            return DockerSandbox(**kwargs)
        if backend == "docker":
            raise SandboxError(f"sandbox backend 'docker' unavailable: {reason}")
        log.info("sandbox backend auto: using local (%s)", reason)
    from producers.sandbox.local import LocalSandbox

    return LocalSandbox(**kwargs)

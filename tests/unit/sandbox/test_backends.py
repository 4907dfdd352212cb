"""Choosing a backend: `make_sandbox` picks Docker only when an engine answers, else local."""

from __future__ import annotations

import pytest

from producers.sandbox.choice import docker_unavailable_reason, make_sandbox
from producers.sandbox.errors import SandboxError
from producers.sandbox.local import Limits, LocalSandbox


def test_local_backend_is_a_local_sandbox_with_the_given_limits():
    with make_sandbox("local", limits=Limits(timeout_s=5)) as box:
        assert isinstance(box, LocalSandbox) and box.limits.timeout_s == 5
        assert box.run("shell", {"command": ["echo", "hi"]}).output == "hi\n"


def test_auto_falls_back_to_local_without_an_engine():
    if docker_unavailable_reason() is None:
        pytest.skip("a Docker engine is reachable here, so auto picks docker")
    with make_sandbox("auto") as box:
        assert isinstance(box, LocalSandbox)


def test_docker_backend_without_an_engine_says_why():
    reason = docker_unavailable_reason()
    if reason is None:
        pytest.skip("a Docker engine is reachable here")
    with pytest.raises(SandboxError, match="sandbox backend 'docker' unavailable"):
        make_sandbox("docker")


def test_an_unknown_backend_is_refused():
    with pytest.raises(SandboxError, match="'podman'"):
        make_sandbox("podman")

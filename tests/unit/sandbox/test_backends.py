"""Choosing a backend: `make_sandbox("auto")` takes local (bubblewrap), then Docker, then refuses;
it runs agent commands unisolated only when asked, and says at INFO/WARNING what it chose."""

from __future__ import annotations

import logging

import pytest

from producers.sandbox import choice
from producers.sandbox.choice import make_sandbox
from producers.sandbox.docker import DockerConfig
from producers.sandbox.errors import SandboxError
from producers.sandbox.local import Limits, LocalSandbox

LOGGER = "producers.sandbox.choice"
NO_ENGINE = DockerConfig(docker_host="unix:///nonexistent/agentstream-test-docker.sock", api_timeout_s=2)


@pytest.fixture(autouse=True)
def _fresh_announcements(monkeypatch):
    monkeypatch.setattr(choice, "_announced", set())


def _without_bubblewrap(monkeypatch):
    """The local backend as on a machine without bubblewrap (unisolated still works)."""

    def local(limits, unisolated):
        if not unisolated:
            raise SandboxError("bubblewrap is not installed: apt-get install bubblewrap")
        return LocalSandbox(limits or Limits(), unisolated=True, bwrap="/nonexistent/bwrap")

    monkeypatch.setattr(choice, "_local", local)


def test_local_backend_is_a_local_sandbox_with_the_given_limits():
    with make_sandbox("local", limits=Limits(timeout_s=5)) as box:
        assert isinstance(box, LocalSandbox) and box.limits.timeout_s == 5
        assert box.run("shell", {"command": ["echo", "hi"]}).output == "hi\n"


def test_auto_takes_the_isolated_local_sandbox_first_and_says_so(caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER), make_sandbox("auto", docker=NO_ENGINE) as box:
        assert isinstance(box, LocalSandbox)
        assert box.isolation["backend"] == "local" and box.isolation["filesystem"] is True
    said = [r.getMessage() for r in caplog.records]
    assert any("auto -> local" in m and "filesystem isolated" in m for m in said), said


@pytest.mark.engine
def test_auto_takes_docker_when_the_local_sandbox_cannot_isolate(monkeypatch, sandbox_engine, caplog):
    from producers.sandbox.docker import DockerSandbox

    _without_bubblewrap(monkeypatch)
    config = DockerConfig(docker_host=sandbox_engine.docker_host, image=sandbox_engine.image)
    with caplog.at_level(logging.INFO, logger=LOGGER), make_sandbox("auto", docker=config) as box:
        assert isinstance(box, DockerSandbox) and box.isolation["backend"] == "docker"
    assert any("auto -> docker" in r.getMessage() for r in caplog.records)


def test_auto_refuses_when_nothing_isolates_and_names_each_reason(monkeypatch):
    _without_bubblewrap(monkeypatch)
    with pytest.raises(SandboxError) as info:
        make_sandbox("auto", docker=NO_ENGINE)
    message = str(info.value)
    assert "local: bubblewrap is not installed" in message and "docker: " in message
    assert "unisolated=True" in message and "sandbox-engine up" in message


def test_auto_runs_unisolated_only_when_asked_and_warns_what_is_missing(monkeypatch, caplog):
    _without_bubblewrap(monkeypatch)
    with (
        caplog.at_level(logging.INFO, logger=LOGGER),
        make_sandbox("auto", docker=NO_ENGINE, unisolated=True) as box,
    ):
        assert box.isolation["filesystem"] is False and box.isolation["missing"]
        assert box.run("shell", {"command": ["echo", "hi"]}).output == "hi\n"
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "unisolated" in r.getMessage()]
    assert warned and "filesystem NOT isolated" in warned[0].getMessage()


def test_docker_backend_without_an_engine_says_why():
    with pytest.raises(SandboxError, match=r"(?i)docker|engine"):
        make_sandbox("docker", docker=NO_ENGINE)


def test_an_unknown_backend_is_refused():
    with pytest.raises(SandboxError, match="'podman'"):
        make_sandbox("podman")

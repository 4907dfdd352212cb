"""The private Docker engine (`infra/sandbox_engine/`): it starts and stops with its own socket and pid
file, leaves the host's network as it was, reuses the image, is stopped by the last session that
uses it (never while another uses it, never when a person started it), and leaves nothing behind.

The image is the session engine's (building one takes a minute); stop and start are tried on scratch
engines without an image, each in its own short state directory (unix socket paths are limited to
108 bytes, and containerd puts its sockets deep under the exec root).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.processes import REPO

pytestmark = [pytest.mark.integration, pytest.mark.engine]


def _host_network() -> dict[str, str]:
    """What a stock dockerd would change: links, ip forwarding, iptables rules (counters and dates out)."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    names = sorted(line.split(":")[1].strip() for line in links.splitlines())
    rules = ""
    if shutil.which("iptables-save"):
        dump = subprocess.run(["iptables-save"], capture_output=True, text=True, check=False).stdout
        rules = "\n".join(line.split(" [")[0] for line in dump.splitlines() if not line.startswith("#"))
    forward = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
    return {"links": ",".join(names), "ip_forward": forward, "iptables": rules}


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _mounts_mentioning(text: str) -> list[str]:
    return [line for line in Path("/proc/mounts").read_text().splitlines() if text in line]


@pytest.fixture
def scratch_engine():
    """A SandboxEngine on a fresh state directory; whatever the test leaves running is stopped."""
    from infra.sandbox_engine.engine import SandboxEngine, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    state = Path(tempfile.mkdtemp(prefix="ase-", dir="/var/tmp"))
    engine = SandboxEngine(state)
    yield engine
    lock = engine.control_lock(timeout_s=60)
    try:
        engine.stop()
    finally:
        lock.release()
    shutil.rmtree(state)


def _nothing_left(engine, pid: int) -> None:
    assert not Path(f"/proc/{pid}").exists(), f"dockerd {pid} still runs"
    assert _processes_mentioning(str(engine.state_dir)) == [], (
        "a process of the engine (containerd?) survived"
    )
    assert _mounts_mentioning(str(engine.state_dir)) == []
    assert not engine.socket.exists() and not engine.pidfile.exists()


def test_the_session_engine_runs_the_sandbox_image(sandbox_engine):
    import docker

    client = docker.DockerClient(base_url=sandbox_engine.docker_host, timeout=60)
    try:
        out = client.containers.run(
            sandbox_engine.image,
            ["python3", "-c", "import pytest, os; print(os.environ['LANG'], pytest.__name__)"],
            network_mode="none",
            remove=True,
        )
        assert {net.name for net in client.networks.list()} == {"host", "none"}  # no bridge to reach anything
    finally:
        client.close()
    assert out.decode().split() == ["C.UTF-8", "pytest"]


def test_the_image_is_reused_when_the_engine_holds_it(sandbox_engine):
    from infra.sandbox_engine.image import ensure_image
    from producers.sandbox.image import SANDBOX_IMAGE

    if sandbox_engine.image != SANDBOX_IMAGE:
        pytest.skip(f"the engine given by the environment holds {sandbox_engine.image}, not {SANDBOX_IMAGE}")
    import docker

    client = docker.DockerClient(base_url=sandbox_engine.docker_host, timeout=60)
    try:
        before = client.images.get(SANDBOX_IMAGE).id
        lines: list[str] = []
        assert ensure_image(client, lines.append) == "reused"
        assert client.images.get(SANDBOX_IMAGE).id == before
    finally:
        client.close()
    assert any("reused" in line for line in lines)


def test_an_engine_starts_on_its_own_socket_and_stops_leaving_the_host_as_it_was(scratch_engine):
    engine = scratch_engine
    before = _host_network()
    lock = engine.control_lock()
    try:
        assert engine.start() == "started"
        pid = engine.pid()
        assert pid is not None and int(engine.pidfile.read_text()) == pid
        assert engine.socket.is_socket() and engine.answers()
        during = _host_network()
        client = engine.client()
        try:
            networks = {net.name for net in client.networks.list()}
        finally:
            client.close()
        assert engine.stop() == "stopped"
    finally:
        lock.release()
    assert networks == {"host", "none"}
    assert "docker0" not in during["links"]
    assert during == before, "the engine changed the host's network while it ran"
    _nothing_left(engine, pid)
    assert _host_network() == before


def test_a_session_engine_stops_with_its_last_user_only(scratch_engine):
    engine = scratch_engine
    first, second = engine.acquire("session"), engine.acquire("session")
    assert first.setup(image="skip").engine == "started"
    assert second.setup(image="skip").engine == "running"  # reused, not a second dockerd
    pid = engine.pid()
    first.release()
    assert engine.pid() == pid and engine.answers(), "stopped while another session used it"
    second.release()
    second.release()  # idempotent
    _nothing_left(engine, pid)


def test_an_engine_a_person_started_survives_the_session(scratch_engine):
    engine = scratch_engine
    assert engine.setup("user", image="skip").engine == "started"
    lease = engine.acquire("session")
    assert lease.setup(image="skip").engine == "running"
    lease.release()
    assert engine.answers() and engine.owner() == "user"


def test_an_engine_killed_without_cleanup_is_cleaned_up_by_the_next_start(scratch_engine):
    engine = scratch_engine
    lock = engine.control_lock()
    try:
        engine.start()
        os.kill(engine.pid(), signal.SIGKILL)  # an abort that skipped every finalizer
        engine._popen.wait(timeout=10)
        engine._popen = None
        assert engine.pid() is None
        assert engine.start() == "started"
        pid = engine.pid()
        assert engine.stop() == "stopped"
    finally:
        lock.release()
    _nothing_left(engine, pid)


def test_stop_removes_the_sandboxs_volumes_and_no_others(scratch_engine):
    from infra.sandbox_engine.engine import SANDBOX_LABEL

    engine = scratch_engine
    lines: list[str] = []
    lock = engine.control_lock()
    try:
        engine.start()
        client = engine.client()
        try:
            client.volumes.create("agentstream-sandbox-left", labels={SANDBOX_LABEL: "1"})
            client.volumes.create("someone-elses")
        finally:
            client.close()
        assert engine.stop(lines.append) == "stopped"
        engine.start()  # the same data root: what stop left is still there
        client = engine.client()
        try:
            names = {volume.name for volume in client.volumes.list()}
        finally:
            client.close()
    finally:
        lock.release()
    assert names == {"someone-elses"}
    assert "removed 0 sandbox container(s) and 1 volume(s)" in lines


SKIPPING_TESTS = """
import pytest

@pytest.mark.engine
def test_needs_an_engine():
    pytest.skip("no engine here")

def test_may_skip():
    pytest.skip("not an engine test")

def test_uses_the_engine(sandbox_engine):
    pass
"""


def test_a_skipped_engine_test_fails_when_engines_are_required(tmp_path):
    (tmp_path / "test_skips.py").write_text(SKIPPING_TESTS)

    def run(required: str) -> str:
        # No dockerd on PATH: the fixture cannot have its engine, as on a machine without apt.
        env = {key: value for key, value in os.environ.items() if not key.startswith("AGENTSTREAM_SANDBOX_")}
        env.update(AGENTSTREAM_REQUIRE_ENGINES=required, PYTHONPATH=str(REPO), PATH=str(tmp_path))
        argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "tests.support.sandbox_engine"]
        argv += ["-p", "no:cacheprovider", str(tmp_path)]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        return done.stdout

    required = run("1")
    assert "1 failed, 1 skipped, 1 error" in required, required
    assert (
        "AGENTSTREAM_REQUIRE_ENGINES=1 and the sandbox engine cannot be had: dockerd is not installed"
        in required
    )
    relaxed = run("0")
    assert "3 skipped" in relaxed, relaxed
    assert "sandbox engine: dockerd is not installed: apt-get install docker.io" in relaxed

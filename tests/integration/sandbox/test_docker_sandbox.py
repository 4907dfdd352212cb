"""`DockerSandbox` against a real engine (python:3.11-slim); skipped with the reason when none."""

from __future__ import annotations

import pytest

from producers.sandbox.docker import DockerConfig, DockerSandbox, docker_unavailable_reason

REASON = docker_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"DockerSandbox needs an engine: {REASON}")


@pytest.fixture
def box():
    sandbox = DockerSandbox(DockerConfig(timeout_s=20))
    yield sandbox
    sandbox.close()


def test_tools_work_in_the_container(box):
    assert box.run("file_write", {"path": "src/a.py", "content": "x = 1\ny = 2\n"}).ok
    assert box.run("file_read", {"path": "src/a.py", "start_line": 2}).output == "y = 2\n"
    assert box.run("search", {"pattern": r"y = \d"}).output.strip() == "src/a.py:2:y = 2"
    assert box.run("shell", {"command": "echo $((1+1))"}).output == "2\n"
    assert box.run("shell", {"command": ["echo", "$(id)"]}).output == "$(id)\n"
    assert box.run("submit", {"answer": "ok"}).ok and box.submitted


def test_paths_outside_the_workspace_are_refused(box):
    for path in ["../etc/passwd", "/etc/passwd"]:
        result = box.run("file_read", {"path": path})
        assert result.exit_code == 1 and "outside the workspace" in result.error


def test_timeout_kills_the_command(box):
    result = box.run("shell", {"command": ["sleep", "600"], "timeout_s": 1})
    assert result.timed_out and result.duration_ms < 10_000


def test_no_network(box):
    code = "import socket; socket.create_connection(('1.1.1.1', 53), 2)"
    assert box.run("shell", {"command": ["python3", "-c", code]}).exit_code != 0


def test_snapshot_copies_the_workspace(box, tmp_path):
    box.run("file_write", {"path": "f.txt", "content": "hello"})
    copy = box.snapshot(tmp_path / "copy")
    assert (copy / "f.txt").read_text() == "hello"

"""What the local sandbox enforces on a hostile command: wall-clock timeouts that kill every child,
the process, memory, CPU and file-size limits, and no network where the kernel allows it."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from producers.sandbox.errors import SandboxError
from producers.sandbox.local import Limits, LocalSandbox, _user_process_count

# The outer sh and its background child print their own host pids (`read` is a builtin, so
# /proc/self is the shell itself), then the child becomes `sleep 600` and the outer shell waits.
SLEEP_WITH_CHILD = (
    "read pid rest < /proc/self/stat; echo $pid; "
    "sh -c 'read pid rest < /proc/self/stat; echo $pid; exec sleep 600' & wait"
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _pids(output: str) -> list[int]:
    """The pids the command printed (unshare may add a line of its own when its child is killed)."""
    return [int(line) for line in output.splitlines() if line.isdigit()]


def _assert_killed_at_timeout(box: LocalSandbox) -> None:
    start = time.monotonic()
    result = box.run("shell", {"command": SLEEP_WITH_CHILD, "timeout_s": 1})
    elapsed = time.monotonic() - start
    assert result.timed_out and result.exit_code != 0 and "timed out after 1" in result.error
    assert 0.9 < elapsed < 4, elapsed
    pids = _pids(result.output)
    assert len(pids) == 2, result.output
    time.sleep(0.1)
    assert [pid for pid in pids if _alive(pid)] == []


def test_sleep_with_a_child_is_killed_at_the_timeout_with_its_children():
    with LocalSandbox() as box:
        _assert_killed_at_timeout(box)


def test_timeout_kills_the_group_without_namespaces_too():
    with LocalSandbox() as box:
        box.isolation["namespaces"] = False  # the fallback path: plain process group
        _assert_killed_at_timeout(box)


def test_a_command_cannot_outlive_its_call_in_the_background():
    with LocalSandbox() as box:
        command = "sh -c 'read pid rest < /proc/self/stat; echo $pid; exec sleep 600' &"
        result = box.run("shell", {"command": command})
        assert result.ok
        time.sleep(0.1)
        assert not any(_alive(pid) for pid in _pids(result.output))


def test_timeout_param_is_capped_by_the_limits():
    with LocalSandbox(limits=Limits(timeout_s=1)) as box:
        result = box.run("shell", {"command": ["sleep", "600"], "timeout_s": 300})
    assert result.timed_out and result.duration_ms < 4000


@pytest.mark.parametrize(
    "code",
    [
        "import os\nwhile True: os.fork()",  # children die when a fork fails
        "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass",  # they spin at the cap
    ],
)
def test_a_fork_bomb_is_held_by_the_process_limit_and_the_machine_survives(code, sandbox_python):
    limits = Limits(processes=32, timeout_s=5)
    peak, stop = [0], threading.Event()
    before = _user_process_count(65534)  # the fallback-path test may leave unreaped zombies
    watcher = threading.Thread(target=_watch_uid, args=(peak, stop), daemon=True)
    with LocalSandbox(limits=limits) as box:
        watcher.start()
        start = time.monotonic()
        result = box.run("shell", {"command": [sandbox_python, "-c", code]})
        stop.set()
        watcher.join()
        assert time.monotonic() - start < 8
        assert result.exit_code != 0
        assert result.timed_out or "Resource temporarily unavailable" in result.output
        assert box.run("shell", {"command": ["echo", "still here"]}).output == "still here\n"
    if os.geteuid() == 0:  # commands ran as uid 65534, alone: its count is the bomb's size
        assert peak[0] <= limits.processes + 2, peak[0]
        assert _user_process_count(65534) <= before


def _watch_uid(peak: list[int], stop: threading.Event) -> None:
    while not stop.is_set() and os.geteuid() == 0:
        peak[0] = max(peak[0], _user_process_count(65534))
        time.sleep(0.05)


def test_a_shell_fork_bomb_is_killed_at_the_timeout():
    before = _user_process_count(65534)
    with LocalSandbox(limits=Limits(processes=32, timeout_s=3)) as box:
        result = box.run("shell", {"command": "b(){ b|b& }; b; sleep 600"})
        assert result.timed_out and result.duration_ms < 15_000  # timeout 3 s, slack for a loaded CI
        assert box.run("shell", {"command": "echo ok"}).ok
    if os.geteuid() == 0:
        assert _user_process_count(65534) <= before


def test_a_memory_hog_fails_by_the_memory_limit(sandbox_python):
    with LocalSandbox(limits=Limits(memory_mb=256, timeout_s=10)) as box:
        result = box.run("shell", {"command": [sandbox_python, "-c", "x = bytearray(2 * 1024**3)"]})
    assert result.exit_code != 0 and not result.timed_out
    assert "MemoryError" in result.output


def test_a_busy_loop_is_stopped_by_the_cpu_limit(sandbox_python):
    with LocalSandbox(limits=Limits(cpu_s=1, timeout_s=20)) as box:
        result = box.run("shell", {"command": [sandbox_python, "-c", "while True: pass"]})
    assert result.exit_code != 0 and not result.timed_out
    assert result.duration_ms < 10_000


def test_a_file_over_the_file_size_limit_cannot_be_written(sandbox_python):
    code = "open('big', 'wb').write(b'x' * 3 * 1024 * 1024)"
    with LocalSandbox(limits=Limits(file_mb=1, timeout_s=10)) as box:
        result = box.run("shell", {"command": [sandbox_python, "-c", code]})
        assert result.exit_code != 0
        assert (box.workspace / "big").stat().st_size <= 1024 * 1024
        refused = box.run("file_write", {"path": "big2", "content": "x" * (2 * 1024 * 1024)})
        assert refused.exit_code == 1 and "file_mb=1" in refused.error


def test_no_network_when_the_kernel_allows_isolation(sandbox_python):
    with LocalSandbox(limits=Limits(timeout_s=10)) as box, socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        if not box.isolation["network"]:
            assert box.isolation["reason"], "no network isolation and no reason reported"
            pytest.skip(f"network isolation unavailable here: {box.isolation['reason']}")
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), 1)"
        result = box.run("shell", {"command": [sandbox_python, "-c", code]})
    assert result.exit_code != 0 and ("Error" in result.output), result.output


def test_isolation_reports_what_is_enforced():
    with LocalSandbox() as box:
        assert {"cpu", "memory", "file_size", "processes", "network", "reason"} <= set(box.isolation)
        if os.geteuid() == 0:
            assert box.isolation["run_as_uid"] == 65534


@pytest.mark.parametrize("field", ["cpu_s", "memory_mb", "processes", "timeout_s", "output_bytes"])
def test_limits_must_be_positive(field):
    with pytest.raises(SandboxError, match=f"Limits.{field}"):
        Limits(**{field: 0})

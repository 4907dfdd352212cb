"""What the local sandbox enforces on a hostile command: wall-clock timeouts and leftovers
(`&`, setsid, double fork, nohup) killed, the process, memory, CPU, file-size and disk limits, and
no network. Processes are looked at from inside (the sandbox's own /proc) and, running as root,
from the host (every process of the sandbox's own uid)."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from producers.sandbox.confinement import processes_of_uid
from producers.sandbox.errors import SandboxError
from producers.sandbox.local import Limits, LocalSandbox

# Every pid in the sandbox's /proc but the lister's own (a builtin loop: no other process).
OTHERS = 'for p in /proc/[0-9]*; do p=${p#/proc/}; [ "$p" = $$ ] || echo "$p"; done'
ROOT = os.geteuid() == 0


def _others(box: LocalSandbox) -> list[str]:
    return box.run("shell", {"command": OTHERS}).output.split()


def _host_processes(box: LocalSandbox) -> int:
    """Processes of the sandbox's host uid (root only: then the uid is the sandbox's alone)."""
    return len(processes_of_uid(box.isolation["host_uid"]))


@pytest.fixture
def box():
    with LocalSandbox(limits=Limits(timeout_s=20)) as sandbox:
        yield sandbox


def test_a_sleep_with_a_child_is_killed_at_the_timeout_with_its_children(box):
    start = time.monotonic()
    result = box.run("shell", {"command": "sh -c 'sleep 600' & sleep 600; wait", "timeout_s": 1})
    elapsed = time.monotonic() - start
    assert result.timed_out and result.exit_code != 0 and "timed out after 1" in result.error
    assert 0.9 < elapsed < 4, elapsed
    assert _others(box) == ["1"]  # only the sandbox's init is left
    if ROOT:
        assert _host_processes(box) == 2  # bwrap and the init


@pytest.mark.parametrize(
    "leftover",
    ["sleep 600 &", "setsid sleep 600 &", "nohup sleep 600 >/dev/null 2>&1 &", "(sh -c 'sleep 600 &' &)"],
)
def test_nothing_a_command_started_outlives_its_call(box, leftover):
    result = box.run("shell", {"command": f"{leftover}\necho started"})
    assert result.ok and "started" in result.output
    assert _others(box) == ["1"]


def test_the_timeout_param_is_capped_by_the_limits():
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
    with LocalSandbox(limits=limits) as box:
        watcher = threading.Thread(target=_watch, args=(box, peak, stop), daemon=True)
        watcher.start()
        start = time.monotonic()
        result = box.run("shell", {"command": [sandbox_python, "-c", code]})
        stop.set()
        watcher.join()
        assert time.monotonic() - start < 10
        assert result.exit_code != 0
        assert result.timed_out or "Resource temporarily unavailable" in result.output
        assert box.run("shell", {"command": ["echo", "still here"]}).output == "still here\n"
        assert _others(box) == ["1"]
    if ROOT:  # bwrap and the init besides the bomb
        assert 3 < peak[0] <= limits.processes + 2, peak[0]


def _watch(box: LocalSandbox, peak: list[int], stop: threading.Event) -> None:
    while not stop.is_set() and ROOT:
        peak[0] = max(peak[0], _host_processes(box))
        time.sleep(0.02)


def test_a_shell_fork_bomb_is_killed_at_the_timeout():
    with LocalSandbox(limits=Limits(processes=32, timeout_s=3)) as box:
        result = box.run("shell", {"command": "b(){ b|b& }; b; sleep 600"})
        assert result.timed_out and result.duration_ms < 15_000  # timeout 3 s, slack for a loaded CI
        assert box.run("shell", {"command": "echo ok"}).ok
        assert _others(box) == ["1"]


def test_a_memory_hog_fails_by_the_memory_limit(sandbox_python):
    with LocalSandbox(limits=Limits(memory_mb=256, timeout_s=10)) as box:
        result = box.run("shell", {"command": [sandbox_python, "-c", "x = bytearray(2 * 1024**3)"]})
    assert result.exit_code != 0 and not result.timed_out
    assert "MemoryError" in result.output


def test_many_processes_under_the_per_process_limit_are_held_by_the_episode_cgroup(sandbox_python):
    """Six processes of 120 MB each stay under RLIMIT_AS (160 MB) but not under the episode's
    cgroup (160 + 40 MB of disk caps + 64): the kernel kills some, the sandbox answers on."""
    limits = Limits(memory_mb=160, workspace_mb=16, tmp_mb=16, shm_mb=8, timeout_s=20)
    with LocalSandbox(limits=limits) as box:
        if not box.isolation["memory"]:
            assert any(m.startswith("memory:") for m in box.isolation["missing"])
            pytest.skip(f"no episode memory limit here: {box.isolation['missing']}")
        hog = "import time; x = bytearray(120 * 1024 * 1024); time.sleep(3); print('survived')"
        script = f'for i in 1 2 3 4 5 6; do {sandbox_python} -c "{hog}" & done; wait'
        result = box.run("shell", {"command": script})
        assert result.output.count("survived") < 6, result.output
        assert box.run("shell", {"command": "echo ok"}).output == "ok\n"
        memory_dir = next(d for d in box._boundary.cgroup.dirs if "memory" in str(d))
        peak = int((memory_dir / "memory.max_usage_in_bytes").read_text())
        assert peak <= limits.boundary_spec().memory_bytes


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
        assert box.run("shell", {"command": "stat -c %s big"}).output == f"{1024 * 1024}\n"
        refused = box.run("file_write", {"path": "big2", "content": "x" * (2 * 1024 * 1024)})
        assert refused.exit_code == 1 and "file_mb=1" in refused.error


@pytest.mark.parametrize("where", ["/workspace", "/tmp", "/dev/shm"])
def test_filling_the_disk_stops_at_the_cap(where):
    limits = Limits(workspace_mb=8, tmp_mb=8, shm_mb=8, file_mb=64, timeout_s=20)
    with LocalSandbox(limits=limits) as box:
        assert box.isolation["disk"] is True
        fill = box.run("shell", {"command": f"dd if=/dev/zero of={where}/fill bs=1M count=32"})
        assert fill.exit_code != 0 and "No space left on device" in fill.output
        used = int(box.run("shell", {"command": f"du -sk {where}"}).output.split()[0])
        assert used <= 8 * 1024
        box.reset()
        assert box.run("shell", {"command": f"ls -A {where}"}).output == ""


@pytest.mark.parametrize("where", ["/", "/dev", "/etc", "/usr"])
def test_nothing_outside_the_capped_mounts_is_writable(box, where):
    result = box.run("shell", {"command": f"touch {where}/x"})
    assert result.exit_code != 0 and "Read-only file system" in result.output, result.output


def test_no_network_not_even_the_hosts_loopback_or_abstract_sockets(box, sandbox_python):
    assert box.isolation["network"] is True
    name = f"agentstream-test-{os.getpid()}"
    with socket.socket() as server, socket.socket(socket.AF_UNIX) as abstract:
        server.bind(("127.0.0.1", 0))
        server.listen()
        abstract.bind("\0" + name)
        abstract.listen()
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            f"targets = [(socket.AF_INET, ('127.0.0.1', {port})), (socket.AF_UNIX, '\\0{name}')]\n"
            "for family, address in targets:\n"
            "    try:\n"
            "        socket.socket(family).connect(address)\n"
            "        print('reached', address)\n"
            "    except OSError as exc:\n"
            "        print('refused', type(exc).__name__)\n"
        )
        result = box.run("shell", {"command": [sandbox_python, "-c", code]})
    assert result.output.count("refused") == 2 and "reached" not in result.output, result.output


def test_network_is_reported_when_the_limits_allow_it():
    with LocalSandbox(limits=Limits(network=True)) as box:
        assert box.isolation["network"] is False
        assert any(m.startswith("network:") for m in box.isolation["missing"])


def test_isolation_reports_the_contract():
    with LocalSandbox() as box:
        info = box.isolation
    assert info["backend"] == "local" and info["per_episode"] is True
    assert info["filesystem"] is True and info["disk"] is True and info["network"] is True
    assert info["processes"] is True and info["user"] == 65534
    assert isinstance(info["missing"], list)
    if ROOT:
        assert info["host_uid"] >= 1_900_000_000 and info["memory"] is True and info["missing"] == []


@pytest.mark.parametrize(
    "field", ["cpu_s", "memory_mb", "processes", "timeout_s", "output_bytes", "workspace_mb", "tmp_mb"]
)
def test_limits_must_be_positive(field):
    with pytest.raises(SandboxError, match=f"Limits.{field}"):
        Limits(**{field: 0})

"""The local sandbox's boundary: the host's files are not there (the checkout, /etc/shadow, /root,
the host's /tmp), its /proc is its own and its init cannot be traced or killed from inside, two
sandboxes do not see each other, reset empties /tmp, a sandbox whose init dies is broken until
reset, and without bubblewrap it refuses unless asked to run unisolated."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from producers.sandbox import confinement
from producers.sandbox.bubblewrap import NamespacePlan, namespace_argv
from producers.sandbox.confinement import processes_of_uid
from producers.sandbox.errors import SandboxError
from producers.sandbox.inside import descendants
from producers.sandbox.local import Limits, LocalSandbox

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def box():
    with LocalSandbox(limits=Limits(timeout_s=20)) as sandbox:
        yield sandbox


def test_the_hosts_files_are_not_there(box, tmp_path):
    host_tmp = tmp_path / "host-secret"
    host_tmp.write_text("x")
    paths = [REPO / "pyproject.toml", REPO, "/etc/shadow", "/etc/gshadow", "/root", "/home", "/var", "/run"]
    paths += [host_tmp, "/opt", "/srv", "/mnt", "/work"]
    for path in paths:
        seen = box.run("shell", {"command": ["test", "-e", str(path)]})
        assert seen.exit_code == 1, f"{path} is visible in the sandbox"
    etc = box.run("shell", {"command": "ls -A /etc"}).output.split()
    assert "shadow" not in etc and "passwd" in etc
    passwd = box.run("shell", {"command": "cat /etc/passwd"}).output
    assert passwd.count("\n") == 2 and "sandbox:x:65534" in passwd  # written for it, not the host's
    assert box.run("shell", {"command": "ls /"}).output.split() == sorted(
        ["bin", "dev", "etc", "lib", "lib64", "proc", "sbin", "tmp", "usr", "workspace"]
    )


def test_proc_1_is_the_sandboxs_own_init_and_cannot_be_traced_or_killed(box):
    assert "-I" in box.run("shell", {"command": "tr '\\0' ' ' </proc/1/cmdline"}).output
    for probe in ("cat /proc/1/environ", "ls /proc/1/fd", "ls /proc/1/root/", "head -c1 /proc/1/mem"):
        result = box.run("shell", {"command": probe})
        assert result.exit_code != 0 and "denied" in result.output, (probe, result.output)
    for sig in ("KILL", "TERM", "INT", "HUP"):
        box.run("shell", {"command": f"kill -{sig} 1"})
    assert box.run("shell", {"command": "echo alive"}).output == "alive\n"
    assert box.run("shell", {"command": "hostname"}).output == "sandbox\n"


def test_two_sandboxes_see_neither_each_others_workspace_nor_tmp_nor_processes():
    others = 'for p in /proc/[0-9]*; do p=${p#/proc/}; [ "$p" = $$ ] || echo "$p"; done'
    with LocalSandbox() as first, LocalSandbox() as second:
        first.run("shell", {"command": "echo one > /workspace/mine; echo one > /tmp/mine"})
        busy = threading.Thread(target=first.run, args=("shell", {"command": "sleep 2"}))
        busy.start()
        time.sleep(0.3)
        assert second.run("shell", {"command": "ls -A /workspace /tmp"}).output == "/tmp:\n\n/workspace:\n"
        assert second.run("shell", {"command": others}).output == "1\n"  # not the first one's sleep
        busy.join()
        if os.geteuid() == 0:
            assert first.isolation["host_uid"] != second.isolation["host_uid"]


def test_reset_empties_tmp_and_dev_shm_and_kills_everything(box):
    box.run("shell", {"command": "echo x > /tmp/f; mkdir -p /tmp/d/e; chmod 0 /tmp/d; echo y > /dev/shm/g"})
    box.run("shell", {"command": "chmod 0 /workspace"})  # the agent owns its mounts: reset copes
    box.reset()
    assert box.run("shell", {"command": "ls -A /tmp /dev/shm /workspace"}).output == (
        "/dev/shm:\n\n/tmp:\n\n/workspace:\n"
    )


def test_a_sandbox_whose_init_died_is_broken_until_reset(box):
    if os.geteuid() != 0:
        pytest.skip("killing the init from the host needs its host pid's owner (root here)")
    box.run("file_write", {"path": "a.txt", "content": "a"})
    init = descendants(box._boundary.proc.pid)[0]
    os.kill(init, signal.SIGKILL)
    first = box.run("shell", {"command": ["true"]})
    assert first.exit_code == 1 and "exited" in first.error
    assert "broken" in box.run("file_read", {"path": "a.txt"}).error
    box.reset()
    assert box.run("shell", {"command": "ls -A"}).output == ""  # a fresh namespace
    assert box.run("shell", {"command": ["echo", "back"]}).output == "back\n"


def test_close_leaves_no_process_uid_lease_or_cgroup_behind():
    box = LocalSandbox()
    boundary = box._boundary
    box.run("shell", {"command": "sleep 600 &"})
    box.close()
    assert boundary.proc.poll() is not None
    if os.geteuid() == 0:
        assert processes_of_uid(box.isolation["host_uid"]) == []
        assert not boundary.lease.path.exists()
        assert not any(d.exists() for d in boundary.cgroup.dirs)


def test_without_bubblewrap_it_refuses_and_says_how_to_go_on():
    with pytest.raises(
        SandboxError, match=r"bubblewrap is not installed.*apt-get install bubblewrap.*unisolated=True"
    ):
        LocalSandbox(bwrap="/nonexistent/bwrap")


def test_unisolated_when_asked_runs_the_same_tools_and_says_what_is_missing(caplog, tmp_path):
    with caplog.at_level(logging.WARNING, logger="producers.sandbox.namespace"):
        box = LocalSandbox(limits=Limits(timeout_s=5), unisolated=True, bwrap="/nonexistent/bwrap")
    info = box.isolation
    assert info["filesystem"] is False and info["network"] is False and info["disk"] is False
    assert any(m.startswith("filesystem: bubblewrap is not installed") for m in info["missing"])
    assert "NOT isolated" in caplog.text and "filesystem" in caplog.text
    workspace = box.workspace
    assert workspace != Path("/workspace") and workspace.is_dir()
    assert (workspace.parent.stat().st_mode & 0o777) == 0o700
    if os.geteuid() == 0:
        assert info["user"] == info["host_uid"] != 0 and info["processes"] is True
    assert box.run("file_write", {"path": "a/b.txt", "content": "hi\n"}).ok
    assert box.run("shell", {"command": "cat a/b.txt; pwd"}).output == f"hi\n{workspace}\n"
    assert "outside the workspace" in box.run("file_read", {"path": "../x"}).error
    assert box.run("search", {"pattern": "hi"}).output == "a/b.txt:1:hi"
    leftover = box.run("shell", {"command": "setsid sleep 600 & echo $!"})
    time.sleep(0.1)
    assert not Path(f"/proc/{leftover.output.strip()}").exists()
    assert box.run("shell", {"command": "sleep 60", "timeout_s": 1}).timed_out
    box.reset(None)
    assert box.run("shell", {"command": "ls -A"}).output == ""
    box.close()
    assert not workspace.exists()


def test_the_namespace_binds_only_usr_and_a_curated_etc():
    plan = NamespacePlan("bwrap", ["prog"], 1, 2, 3, etc_fds={"passwd": 7})
    argv = namespace_argv(plan)
    binds = [argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind", "--dev-bind")]
    assert "--bind" not in argv and "--dev-bind" not in argv
    assert all(b == "/usr" or b.startswith("/etc/") for b in binds), binds
    assert not any(b in ("/etc/shadow", "/etc/passwd", "/etc/group") for b in binds)
    assert argv[argv.index("--ro-bind-data") + 1 : argv.index("--ro-bind-data") + 3] == ["7", "/etc/passwd"]
    assert argv[argv.index("--chdir") - 2 : argv.index("--chdir")] == ["--remount-ro", "/"]
    assert "--share-net" not in argv and "--share-net" in namespace_argv(
        NamespacePlan("bwrap", ["prog"], 1, 2, 3, network=True)
    )


def test_a_sandbox_made_in_a_thread_that_ended_still_works():
    """No PR_SET_PDEATHSIG tie to the creating thread (bwrap's --die-with-parent would kill the
    namespace when that thread exits, as worker threads of a pool do)."""
    made: list[LocalSandbox] = []
    worker = threading.Thread(target=lambda: made.append(LocalSandbox()))
    worker.start()
    worker.join()
    with made[0] as box:
        time.sleep(0.2)
        assert box.run("shell", {"command": ["echo", "alive"]}).output == "alive\n"


def test_when_the_host_process_dies_its_sandbox_dies_with_it():
    code = (
        "from producers.sandbox.local import LocalSandbox\n"
        "box = LocalSandbox()\n"
        "box.run('shell', {'command': 'echo x > /tmp/x'})\n"
        "lease = box._boundary.lease\n"
        "print(box._boundary.proc.pid, lease.uid if lease else '', flush=True)\n"
        "box.run('shell', {'command': 'sleep 600'})\n"
    )
    host = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    bwrap, _, uid = host.stdout.readline().strip().partition(" ")
    bwrap = int(bwrap)
    time.sleep(0.3)  # the sleep is running inside
    host.kill()
    host.wait()
    deadline = time.monotonic() + 5
    while Path(f"/proc/{bwrap}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{bwrap}").exists() or Path(f"/proc/{bwrap}/stat").read_text().split()[2] == "Z"
    if os.geteuid() == 0:  # its uid lease and cgroups are left behind, and the next sandbox sweeps them
        lease, cgroup = confinement.LEASE_DIR / f"{uid}.lock", f"{confinement.CGROUP_PREFIX}{uid}"
        assert lease.exists() and confinement._cgroup_dirs(cgroup), "nothing left to sweep: proves nothing"
        with LocalSandbox():
            pass
        assert not lease.exists() and confinement._cgroup_dirs(cgroup) == []

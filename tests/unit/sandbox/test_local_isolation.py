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


@pytest.fixture
def scratch_cgroup():
    """As root, a child (pids and memory) of this process's own cgroups for a host process to run
    in, so that what its sandbox makes is not under this process's cgroups; removed afterwards."""
    dirs = []
    if os.geteuid() == 0:
        for controller in confinement.CONTROLLERS:
            parent = confinement._own_cgroup(controller)
            if parent is not None:
                dirs.append(parent / f"agentstream-test-scratch-{os.getpid()}")
                dirs[-1].mkdir(exist_ok=True)
    yield confinement.Cgroup(dirs) if dirs else None
    inner = [sub for d in dirs for sub in d.glob(f"{confinement.CGROUP_PREFIX}*")]
    confinement.Cgroup([*inner, *dirs]).remove()


def test_when_the_host_process_dies_its_sandbox_dies_with_it(scratch_cgroup, tmp_path, monkeypatch):
    """The killed host ran in another cgroup than the process that sweeps up after it (as each job
    on a shared host does): its lease file's record is what leads the sweep to its cgroups. The
    leases are in a directory of this test's (any other sandbox on the host would sweep them)."""
    monkeypatch.setattr(confinement, "LEASE_DIR", tmp_path / "leases")
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from producers.sandbox import confinement\n"
        "from producers.sandbox.local import LocalSandbox\n"
        "confinement.LEASE_DIR = Path(sys.argv[1])\n"
        "box = LocalSandbox()\n"
        "box.run('shell', {'command': 'echo x > /tmp/x'})\n"
        "lease = box._boundary.lease\n"
        "print(box._boundary.proc.pid, lease.uid if lease else '', flush=True)\n"
        "box.run('shell', {'command': 'sleep 600'})\n"
    )
    argv = [sys.executable, "-c", code, str(confinement.LEASE_DIR)]
    argv = scratch_cgroup.enter_argv(argv) if scratch_cgroup else argv
    host = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)
    bwrap, _, uid = host.stdout.readline().strip().partition(" ")
    bwrap = int(bwrap)
    time.sleep(0.3)  # the sleep is running inside
    host.kill()
    host.wait()
    deadline = time.monotonic() + 5
    while Path(f"/proc/{bwrap}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{bwrap}").exists() or Path(f"/proc/{bwrap}/stat").read_text().split()[2] == "Z"
    if os.geteuid() == 0:  # its uid lease and cgroups are left behind: the next sandbox sweeps them
        lease = confinement.LEASE_DIR / f"{uid}.lock"
        left = (
            [d / f"{confinement.CGROUP_PREFIX}{uid}" for d in scratch_cgroup.dirs] if scratch_cgroup else []
        )
        assert lease.exists() and all(d.is_dir() for d in left), "nothing left to sweep: proves nothing"
        assert set(confinement.recorded_cgroups(lease.read_bytes(), int(uid))) == set(left)
        with LocalSandbox():
            pass
        assert not lease.exists() and not any(d.exists() for d in left)


def test_a_lease_record_names_only_that_sandboxs_own_cgroups(tmp_path, caplog):
    uid = confinement.UID_BASE + 7
    name = f"{confinement.CGROUP_PREFIX}{uid}"
    memory = Path(os.path.realpath(confinement.CGROUP_ROOT / "memory"))
    (tmp_path / "link").symlink_to(memory / "job")
    refused = [
        memory / "job" / f"{confinement.CGROUP_PREFIX}{uid + 1}",  # another sandbox's
        memory / "job" / "..",  # not a name at all
        memory / "job" / ".." / name,  # not what it resolves to
        tmp_path / "link" / name,  # through a link
        tmp_path / name,  # not in a cgroup hierarchy
        confinement.CGROUP_ROOT / "cpu" / name,  # a controller this module does not use
        confinement.CGROUP_ROOT / name,  # above the controllers
        Path("relative") / name,
    ]
    lines = [
        str(memory / "job" / name).encode(),
        *(str(p).encode() for p in refused),
        b"/\xff/" + name.encode(),
    ]
    with caplog.at_level(logging.WARNING, logger="producers.sandbox.confinement"):
        assert confinement.recorded_cgroups(b"\n".join(lines) + b"\n", uid) == [memory / "job" / name]
    assert caplog.text.count("not a cgroup of that sandbox: left alone") == len(refused) + 1


def test_the_sweep_follows_no_record_out_of_the_cgroup_hierarchy(tmp_path, caplog):
    uid = confinement.UID_BASE + 11
    victim = tmp_path / "victim" / f"{confinement.CGROUP_PREFIX}{uid}"  # named like its cgroup
    victim.mkdir(parents=True)
    leases = tmp_path / "leases"
    leases.mkdir()
    (leases / f"{uid}.lock").write_text(f"{victim}\n")
    with caplog.at_level(logging.WARNING, logger="producers.sandbox.confinement"):
        assert confinement.sweep_stale(leases) == [uid]
    assert victim.is_dir() and str(victim) in caplog.text
    assert not (leases / f"{uid}.lock").exists()


def test_a_cgroup_that_will_not_go_is_named_in_a_warning(tmp_path, caplog):
    stuck = tmp_path / "stuck"
    stuck.mkdir()
    (stuck / "cgroup.procs").write_text("")  # a directory rmdir refuses, with nobody in it
    with caplog.at_level(logging.WARNING, logger="producers.sandbox.confinement"):
        assert confinement.Cgroup([stuck, tmp_path / "gone"]).remove() == [stuck]
    assert f"gave up removing cgroup {stuck}" in caplog.text

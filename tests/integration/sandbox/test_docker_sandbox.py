"""`DockerSandbox` against the real engine of the test session (`sandbox_engine`): its tools, its
limits and its clean-up, each proven from inside the container and, where the host can see it,
from the engine (the container's processes, containers and volumes by label).

One sandbox serves the module (tests that restart it leave it usable: that is part of what they
prove); the escape suite proper lives elsewhere.
"""

from __future__ import annotations

import os
import stat

import pytest

from producers.sandbox.docker import DockerConfig, DockerSandbox
from producers.sandbox.errors import SandboxError

pytestmark = [pytest.mark.integration, pytest.mark.engine]

LABEL = "agentstream.sandbox=1"


def config(engine, **changes) -> DockerConfig:
    base = {
        "image": engine.image,
        "docker_host": engine.docker_host,
        "memory": "256m",
        "pids_limit": 64,
        "tmp_size": "16m",
        "workspace_size": "32m",
        "shm_size": "8m",
        "timeout_s": 20,
        "output_bytes": 100_000,
    }
    return DockerConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def engine_client(sandbox_engine):
    import docker

    client = docker.DockerClient(base_url=sandbox_engine.docker_host, timeout=60)
    yield client
    client.close()


@pytest.fixture(scope="module")
def box(sandbox_engine):
    sandbox = DockerSandbox(config(sandbox_engine))
    yield sandbox
    sandbox.close()


def sh(box, script: str, **params):
    return box.run("shell", {"command": script, **params})


def processes(engine_client, box) -> list[str]:
    """The container's processes as the engine sees them (host side): their command lines."""
    top = engine_client.api.top(box.isolation["container"], ps_args="-o pid,args")
    return [row[1] for row in top["Processes"]]


def test_tools_work_in_the_container(box):
    assert box.run("file_write", {"path": "src/a.py", "content": "x = 1\ny = 2\nz = 3\n"}).ok
    assert box.run("file_read", {"path": "src/a.py"}).output == "x = 1\ny = 2\nz = 3\n"
    assert box.run("file_read", {"path": "src/a.py", "start_line": 2, "end_line": 2}).output == "y = 2\n"
    assert box.run("file_read", {"path": "src/a.py", "start_line": 3}).output == "z = 3\n"
    assert box.run("search", {"pattern": r"y = \d"}).output == "src/a.py:2:y = 2"
    assert box.run("search", {"pattern": "x", "path": "src", "file_pattern": "*.txt"}).output == ""
    assert sh(box, "echo $((1+1))").output == "2\n"
    assert box.run("shell", {"command": ["echo", "$(id)"]}).output == "$(id)\n"
    assert sh(box, "pwd", work_dir="src").output == "/workspace/src\n"
    assert box.run("git", {"subcommand": "init", "args": ["-q"]}).ok
    assert "src/" in box.run("git", {"subcommand": "status", "args": ["--short"]}).output
    failed = sh(box, "echo oops >&2; exit 3")
    assert (failed.exit_code, failed.output, failed.error) == (3, "oops\n", "command exited with code 3")
    assert box.run("submit", {"answer": "ok"}).ok and box.submitted


def test_bad_tool_parameters_are_refused(box):
    assert box.run("file_read", {"path": "src/a.py", "end_line": 0}).exit_code == 1
    assert "not a regular expression" in box.run("search", {"pattern": "("}).error
    assert "not a file" in box.run("file_read", {"path": "src"}).error
    assert (
        "does not exist"
        in box.run("file_write", {"path": "new/x", "content": "", "create_dirs": False}).error
    )


def test_paths_outside_the_workspace_are_refused_also_through_symlinks(box):
    for path in ["../etc/passwd", "/etc/passwd", "src/../../tmp"]:
        result = box.run("file_read", {"path": path})
        assert result.exit_code == 1 and "outside the workspace" in result.error
    assert sh(box, "ln -sfn /etc/passwd pw && ln -sfn / root && ln -sfn /tmp tmplink").ok
    refused = [
        box.run("file_read", {"path": "pw"}),
        box.run("file_write", {"path": "root/tmp/planted", "content": "x"}),
        box.run("file_write", {"path": "tmplink/planted", "content": "x"}),
        box.run("search", {"pattern": "root", "path": "root/etc"}),
        sh(box, "ls", work_dir="root"),
    ]
    for result in refused:
        assert result.exit_code == 1 and "outside the workspace" in result.error, result
    assert sh(box, "ls /tmp/planted").exit_code != 0
    # A symlink inside the workspace is followed: it stays inside.
    assert sh(box, "ln -sfn src/a.py alias").ok
    assert box.run("file_read", {"path": "alias", "end_line": 1}).output == "x = 1\n"


def test_commands_run_unprivileged_without_capabilities(box):
    assert sh(box, "id -u; id -g").output == "65534\n65534\n"
    status = dict(line.split(":\t", 1) for line in sh(box, "cat /proc/self/status").output.splitlines())
    assert (
        int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0 and int(status["CapBnd"], 16) == 0
    )
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"
    for target in ["/etc/planted", "/planted", "/usr/bin/planted"]:
        result = sh(box, f"echo x > {target}")
        assert result.exit_code != 0 and "Read-only file system" in result.output
    assert "Permission denied" in sh(box, "cat /etc/shadow").output
    iso = box.isolation
    assert iso["backend"] == "docker" and iso["user"] == 65534 and iso["per_episode"] is True
    assert all(iso[key] is True for key in ("filesystem", "network", "processes", "memory", "disk"))


def test_tmp_and_workspace_are_size_capped(box):
    tmp = sh(box, "dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>&1; rm -f /tmp/fill")
    assert "No space left on device" in tmp.output
    ws = sh(box, "dd if=/dev/zero of=fill bs=1M count=64 2>&1; rm -f fill")
    assert "No space left on device" in ws.output


def test_no_network_interface_but_loopback(box):
    interfaces = [
        line.split(":")[0].strip() for line in sh(box, "tail -n +3 /proc/net/dev").output.splitlines()
    ]
    assert interfaces == ["lo"]
    code = "import socket; socket.create_connection(('1.1.1.1', 53), 2)"
    result = box.run("shell", {"command": ["python3", "-c", code]})
    assert result.exit_code != 0 and "Network is unreachable" in result.output


def test_a_fork_bomb_stops_at_the_pids_limit_and_nothing_survives(box, engine_client):
    bomb = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while n < 1000:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as exc:\n"
        "    print('stopped', n, exc.errno)\n"
    )
    result = box.run("shell", {"command": ["python3", "-c", bomb]})
    words = result.output.split()
    assert words[0] == "stopped" and int(words[1]) < 64 and words[2] == "11", result  # EAGAIN
    assert len(processes(engine_client, box)) == 2  # docker-init and the keeper
    assert sh(box, "echo alive").output == "alive\n"


def test_a_memory_bomb_is_oom_killed_and_said_so(box):
    result = box.run("shell", {"command": ["python3", "-c", "x = b'x' * (600 << 20)"]})
    assert result.exit_code == 137 and not result.timed_out
    assert "OOM killer" in result.error and "256m" in result.error
    assert sh(box, "echo alive").output == "alive\n"


def test_background_processes_do_not_outlive_the_call(box, engine_client):
    script = (
        "setsid sleep 301 >/dev/null 2>&1 & "
        "nohup sleep 302 >/dev/null 2>&1 & "
        "(sleep 303 >/dev/null 2>&1 &) ; echo started"
    )
    sh(box, "echo kept > /tmp/marker")
    result = sh(box, script)
    assert (result.output, result.error) == ("started\n", None)  # ended by the wrapper, no restart
    assert not [p for p in processes(engine_client, box) if "sleep 30" in p]
    assert sh(box, "cat /tmp/marker").output == "kept\n"
    assert "sleep 30" not in sh(box, "ps -eo args").output


def test_an_agent_that_kills_its_wrapper_or_everything_leaves_nothing(box, engine_client):
    box.run("file_write", {"path": "keep.txt", "content": "kept"})
    sh(box, "echo x > /tmp/scratch")
    killer = sh(box, "setsid sleep 304 >/dev/null 2>&1 </dev/null & kill -9 $PPID")
    assert "left running were ended" in killer.error
    assert not [p for p in processes(engine_client, box) if "sleep 304" in p]
    everything = sh(box, "setsid sleep 305 >/dev/null 2>&1 </dev/null & kill -9 -1")
    assert everything.exit_code != 0
    assert len(processes(engine_client, box)) == 2
    assert box.run("file_read", {"path": "keep.txt"}).output == "kept"


def test_the_timeout_kills_everything_even_an_agent_that_kills_its_timeout(box, engine_client):
    box.run("file_write", {"path": "survivor.txt", "content": "still here"})
    # No process inside keeps the time: kill the wrapper and any `timeout`, then keep running.
    escape = "setsid sleep 306 & kill -9 $PPID; pkill -9 -x timeout; exec sleep 307"
    result = sh(box, escape, timeout_s=2)
    assert result.timed_out and result.exit_code == -9 and 1900 < result.duration_ms < 10_000
    assert "killed and restarted" in result.error
    assert not [p for p in processes(engine_client, box) if "sleep 30" in p]
    assert box.run("file_read", {"path": "survivor.txt"}).output == "still here"
    assert sh(box, "echo alive").output == "alive\n"


def test_output_is_cut_at_the_limit(box):
    result = sh(box, "head -c 300000 /dev/zero | tr '\\0' a")
    assert result.output.startswith("a" * 100_000) and "output truncated at 100000 bytes" in result.output


def test_reset_and_snapshot_round_trip(box, tmp_path):
    source = tmp_path / "repo"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (source / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (source / "run.sh").chmod(0o755)
    (source / "link").symlink_to("pkg/mod.py")
    sh(box, "echo x > /tmp/leftover")
    box.reset(source)
    assert not box.submitted
    assert sh(box, "ls /tmp").output == ""
    listing = sh(box, "stat -c '%U %a %n' run.sh pkg/mod.py; readlink link; ./run.sh").output.splitlines()
    assert listing == ["nobody 755 run.sh", "nobody 644 pkg/mod.py", "pkg/mod.py", "ran"]
    assert not sh(box, "ls keep.txt").ok  # the old workspace is gone
    box.run("file_write", {"path": "pkg/mod.py", "content": "VALUE = 2\n"})
    sh(box, "ln -s /etc/passwd outside")
    copy = box.snapshot(tmp_path / "copy")
    assert (copy / "pkg" / "mod.py").read_text() == "VALUE = 2\n"
    assert stat.S_IMODE((copy / "run.sh").stat().st_mode) == 0o755
    assert os.readlink(copy / "link") == "pkg/mod.py"
    assert not (copy / "outside").is_symlink()  # refused by the "data" filter, never followed
    with pytest.raises(SandboxError, match="exists already"):
        box.snapshot(copy)
    box.reset()
    assert sh(box, "ls -A").output == ""


def test_close_leaves_no_container_and_no_volume(sandbox_engine, engine_client):
    def ours(name: str) -> list[str]:
        containers = engine_client.containers.list(all=True, filters={"label": LABEL})
        volumes = engine_client.volumes.list(filters={"label": LABEL})
        return sorted(x.name for x in [*containers, *volumes] if x.name.startswith(name))

    sandbox = DockerSandbox(config(sandbox_engine))
    name = sandbox.isolation["container"]
    assert ours(name) == [name, name, f"{name}-holder"]  # container, volume, holder
    sandbox.close()
    sandbox.close()  # idempotent
    assert ours(name) == []
    assert "closed" in sandbox.run("shell", {"command": "true"}).error


def test_construction_says_what_is_missing(sandbox_engine):
    with pytest.raises(SandboxError, match=r"no image 'agentstream-sandbox:no-such-tag'.*sandbox-engine up"):
        DockerSandbox(config(sandbox_engine, image="agentstream-sandbox:no-such-tag"))
    nowhere = "unix:///nonexistent/docker.sock"
    with pytest.raises(SandboxError, match=rf"no Docker engine answers at {nowhere}.*sandbox-engine up"):
        DockerSandbox(config(sandbox_engine, docker_host=nowhere, api_timeout_s=2))

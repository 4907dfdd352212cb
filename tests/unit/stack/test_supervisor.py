"""The one supervisor (`agentstream up`, `agentstream worker --roles a,b`): restarts per policy, stops
the tree on SIGTERM, and leaves no orphan when it is killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from infra.supervisor import Component, Supervisor
from streams.config import EXIT_REPLAY
from tests.support.processes import hard_kill, pid_gone, wait_for

# exits with the given code the first time (no marker yet), then runs until killed
SCRIPT = """
import pathlib, sys, time
marker = pathlib.Path(sys.argv[1])
if not marker.exists():
    marker.write_text("ran")
    sys.exit({code})
time.sleep(60)
"""


def _supervisor(tmp_path, name: str, code: int, restart: str = "replay") -> Supervisor:
    args = ("-c", SCRIPT.format(code=code), str(tmp_path / name))
    return Supervisor(
        [Component(name, args, restart=restart)], program=(sys.executable,), cwd=tmp_path, on_event=print
    )


def test_a_replay_exit_is_restarted_and_other_exits_are_final(tmp_path):
    supervisor = _supervisor(tmp_path, "rules", EXIT_REPLAY)
    supervisor.start()
    entry = supervisor.running["rules"]
    first_pid = entry.popen.pid
    try:
        wait_for(
            lambda: not supervisor.poll() and entry.popen is not None and entry.popen.pid != first_pid,
            timeout_s=20,
            what="the role to be restarted after its replay exit",
        )
        assert entry.popen.poll() is None
        assert entry.quick_exits == 1
    finally:
        supervisor.stop(grace_s=2)

    failing = _supervisor(tmp_path, "assembler", 3)
    failing.start()
    failing.running["assembler"].popen.wait(timeout=20)
    time.sleep(0.1)
    assert failing.poll() == ["assembler"]
    assert failing.running["assembler"].popen is None  # not restarted


def test_the_stack_policy_restarts_any_exit(tmp_path):
    supervisor = _supervisor(tmp_path, "sink", 3, restart="always")
    supervisor.start()
    entry = supervisor.running["sink"]
    first_pid = entry.popen.pid
    try:
        wait_for(
            lambda: not supervisor.poll() and entry.popen is not None and entry.popen.pid != first_pid,
            timeout_s=20,
            what="the component to be restarted after exiting with code 3",
        )
        assert entry.restarts == 1 and entry.last_exit == 3
    finally:
        supervisor.stop(grace_s=2)


def test_run_stops_the_others_and_fails_when_a_role_exits_for_good(tmp_path):
    steady = Component("rules", ("-c", "import time; time.sleep(60)"), restart="replay")
    broken = Component("assembler", ("-c", "import sys; sys.exit(3)"), restart="replay")
    supervisor = Supervisor([steady, broken], program=(sys.executable,), cwd=tmp_path, on_event=print)
    started = time.monotonic()
    assert supervisor.run() == 1
    assert time.monotonic() - started < 15
    assert supervisor.running["rules"].last_exit == -signal.SIGTERM


# A supervisor of one child that starts a grandchild; prints the three PIDs, then supervises.
TREE = """
import subprocess, sys, time
from infra.supervisor import Component, Supervisor
grandchild = (
    "import subprocess, sys, time; "
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
    "print(p.pid, flush=True); time.sleep(120)"
)
supervisor = Supervisor([Component("child", ("-c", grandchild))], program=(sys.executable,))
supervisor.start()
print("child", supervisor.running["child"].popen.pid, flush=True)
sys.exit(supervisor.run())
"""


def _tree(tmp_path) -> tuple[subprocess.Popen, list[int]]:
    """Start TREE; returns it and the PIDs of its child and grandchild."""
    proc = subprocess.Popen(
        [sys.executable, "-c", TREE],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
        start_new_session=True,
    )
    child = int(proc.stdout.readline().split()[1])
    grandchild = int(proc.stdout.readline())
    return proc, [child, grandchild]


def test_sigterm_stops_the_tree_including_grandchildren(tmp_path):
    proc, pids = _tree(tmp_path)
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        wait_for(lambda: all(pid_gone(p) for p in pids), timeout_s=5, what="child and grandchild to exit")
    finally:
        hard_kill([proc.pid, *pids])


def test_a_killed_supervisor_leaves_no_orphan(tmp_path):
    proc, pids = _tree(tmp_path)
    try:
        proc.kill()
        proc.wait(timeout=5)
        wait_for(lambda: all(pid_gone(p) for p in pids), timeout_s=5, what="child and grandchild to exit")
    finally:
        hard_kill(pids)


def test_the_policy_server_is_a_stack_component_only_when_asked(tmp_path):
    from infra.stack import components, embedded_config

    names = [c.name for c in components(embedded_config(tmp_path))]
    assert "policy" not in names
    with_policy = {c.name: c for c in components(embedded_config(tmp_path, policy=True, policy_port=8123))}
    assert with_policy["policy"].args[:3] == ("policy", "--port", "8123")
    assert with_policy["policy"].ready_file == "run/policy.ready"


def test_the_console_comes_last_once_the_sink_serves_clickhouse(tmp_path):
    from infra.stack import components, embedded_config

    assert "console" not in [c.name for c in components(embedded_config(tmp_path))]
    config = embedded_config(tmp_path, console=True)
    parts = {c.name: c for c in components(config)}
    assert list(parts)[-1] == "console"
    assert parts["console"].args[:3] == ("console", "--port", str(config.console_port))
    assert parts["console"].ready_file == "run/console.ready"
    assert parts["sink"].ready_file == "run/sink.ready" and "--ready-file" in parts["sink"].args


def test_up_runs_the_console_unless_told_not_to():
    from infra.cli.main import build_parser
    from infra.commands.stack import _stack_config

    parser = build_parser()
    assert _stack_config(parser.parse_args(["up"])).console
    config = _stack_config(parser.parse_args(["up", "--no-console", "--console-port", "9001"]))
    assert not config.console and config.console_port == 9001

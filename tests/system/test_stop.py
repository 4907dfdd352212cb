"""`agentstream up` leaves nothing behind: SIGTERM (what systemd, Docker and Kubernetes send) stops
every process of the stack within the grace period, and a `kill -9` of the supervisor takes the
whole tree with it within a few seconds.

The PIDs come from the stack's state file (`run/stack.json`) and from walking /proc for every
descendant of the supervisor before it is signalled; each must be gone (or a zombie) afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from infra.supervisor import STOP_GRACE_S
from tests.support.processes import AGENTSTREAM, Proc, descendants, free_port, hard_kill, pid_gone, wait_for

pytestmark = [pytest.mark.integration]
STACK = ("broker", "scoring", "sink", "console")


def _started_stack(tmp_path: Path) -> tuple[Proc, list[int]]:
    """`agentstream up` (broker, roles, sink, console; no batch builder) once all components run; its PIDs."""
    data_dir = tmp_path / "stack"
    args = [
        *AGENTSTREAM,
        "up",
        "--no-batch",
        "--data-dir",
        str(data_dir),
        "--broker-port",
        str(free_port()),
        "--console-port",
        str(free_port()),
    ]
    up = Proc(args, tmp_path / "up.log")
    state_file = data_dir / "run" / "stack.json"

    def running_pids():
        if "[up] running:" not in up.log_text():
            assert up.alive(), up.log_text()
            return None
        state = json.loads(state_file.read_text())
        pids = {name: c["pid"] for name, c in state["components"].items()}
        assert set(pids) == set(STACK) and state["supervisor_pid"] == up.pid
        return list(pids.values())

    try:
        pids = wait_for(running_pids, timeout_s=60, interval_s=0.2, what="the stack to run")
        bootstrap = json.loads(state_file.read_text())["bootstrap_servers"]
        wait_for(
            lambda: _groups_joined(bootstrap), timeout_s=60, interval_s=0.5, what="both roles to consume"
        )
        tree = descendants(up.pid)
        assert set(pids) <= set(tree)
    except BaseException:
        tree = descendants(up.pid)
        up.stop()
        hard_kill([p for p in tree if not pid_gone(p)])
        raise
    return up, sorted(set(tree))


def _groups_joined(bootstrap: str) -> bool:
    """The stream role consumes: its consumer group exists on the stack's broker."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        groups = {g["group_id"] for g in admin.list_groups()}
    finally:
        admin.close()
    return "agentstream-scoring" in groups


def _left(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        if not pid_gone(pid):
            try:
                out.append(f"{pid}: {Path(f'/proc/{pid}/cmdline').read_text().replace(chr(0), ' ')}")
            except OSError:
                continue
    return out


def test_sigterm_stops_every_process_of_the_stack_within_the_grace_period(tmp_path):
    up, pids = _started_stack(tmp_path)
    try:
        status = subprocess.run(
            [*AGENTSTREAM, "status", "--data-dir", str(tmp_path / "stack"), "--sample-seconds", "0.2"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stderr
        assert "| scoring " in status.stdout and "dead letters: 0" in status.stdout
        started = time.monotonic()
        os.kill(up.pid, signal.SIGTERM)  # the supervisor only, as systemd / docker stop would
        assert up.popen.wait(timeout=STOP_GRACE_S * len(STACK)) == 0
        wait_for(
            lambda: not _left(pids), timeout_s=STOP_GRACE_S, what=f"the stack's processes to exit: {pids}"
        )
        assert time.monotonic() - started < STOP_GRACE_S
        log = up.log_text()
        assert "SIGTERM received; stopping" in log and "[up] stopped" in log
        assert json.loads((tmp_path / "stack" / "run" / "stack.json").read_text())["stopped"] is True
    finally:
        hard_kill([p for p in pids if not pid_gone(p)])
        up.stop()


def test_a_killed_supervisor_leaves_no_process_of_the_stack(tmp_path):
    up, pids = _started_stack(tmp_path)
    try:
        os.kill(up.pid, signal.SIGKILL)
        up.popen.wait(timeout=10)
        wait_for(lambda: not _left(pids), timeout_s=5, what=f"the orphaned processes to exit: {_left(pids)}")
    finally:
        hard_kill([p for p in pids if not pid_gone(p)])
        up.stop()

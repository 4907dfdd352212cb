"""`agentstream worker` restarts a role that exits to replay (EXIT_REPLAY) and gives up on others."""

from __future__ import annotations

import sys
import time

from streams.config import EXIT_REPLAY
from streams.worker import _RoleChild
from tests.support.processes import wait_for

# exits with EXIT_REPLAY the first time (no marker yet), then runs until killed
SCRIPT = """
import pathlib, sys, time
marker = pathlib.Path(sys.argv[1])
if not marker.exists():
    marker.write_text("ran")
    sys.exit({code})
time.sleep(60)
"""


def test_a_replay_exit_is_restarted_and_other_exits_are_final(tmp_path):
    child = _RoleChild("rules", [sys.executable, "-c", SCRIPT.format(code=EXIT_REPLAY), str(tmp_path / "m")])
    first_pid = child.popen.pid
    try:
        wait_for(
            lambda: child.poll_and_maybe_restart() and child.popen.pid != first_pid,
            timeout_s=20,
            what="the role to be restarted after its replay exit",
        )
        assert child.popen.poll() is None
        assert child.quick_exits == 1
    finally:
        child.popen.kill()
        child.popen.wait()

    failing = _RoleChild("assembler", [sys.executable, "-c", SCRIPT.format(code=3), str(tmp_path / "n")])
    failing.popen.wait(timeout=20)
    time.sleep(0.1)
    assert failing.poll_and_maybe_restart() is False

"""Integration: a training group with nothing to train outlives its collective timeout.

Two real ranks (gloo, CPU) with the timeout cut to 2 s (`AGENTSTREAM_GROUP_TIMEOUT_S`): rank 0
sits idle for 3x the timeout, then hands one batch to rank 1 and stops it. With rank 0's keepalive
(as `follow` runs it) rank 1 skips the idle items, trains the batch and exits 0; without it, rank 1
times out waiting for its next item and fails (the case that shows the test can fail).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from consumers.training.distributed import TIMEOUT_ENV
from tests.support.processes import REPO, free_port, hard_kill

pytestmark = [pytest.mark.integration]

TIMEOUT_S = 2.0
IDLE_S = 3 * TIMEOUT_S

RANK = """
import sys, time
from consumers.training.distributed import join_group, leave_group
from consumers.training.group_work import LeadExecutor, follow_lead
from consumers.training.versions import TrainState

class Fake:
    def __init__(self):
        self.state, self.trained = TrainState(), []
    def train_batch(self, rows, method, batch_id, *, source_ranges=None):
        self.trained.append(batch_id)

keepalive, idle_s = sys.argv[1] == "on", float(sys.argv[2])
ranks = join_group("cpu")
if ranks.is_main:
    lead = LeadExecutor(Fake(), ranks)
    if keepalive:
        lead.start_keepalive()
    time.sleep(idle_s)  # no batch: the consume loop polls an empty topic
    lead.train_batch([{"x": 1}], "sft", "b1")
    lead.stop_others()
    lead.close()
    print("rank 0 idle items", lead.idle_sent, flush=True)
else:
    fake = Fake()
    follow_lead(fake, ranks)
    print("rank 1 trained", fake.trained, flush=True)
leave_group()
"""


def _group(keepalive: str) -> list[tuple[int, str]]:
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port, TIMEOUT_ENV: str(TIMEOUT_S), "OMP_NUM_THREADS": "1",
               "PATH": "/usr/bin:/bin"}  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, "-c", RANK, keepalive, str(IDLE_S)], cwd=REPO, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        ))  # fmt: skip
    try:
        return [(p.wait(timeout=120), p.stdout.read()) for p in procs]
    finally:
        hard_kill([p.pid for p in procs if p.poll() is None])


def test_an_idle_group_outlives_the_collective_timeout_with_the_keepalive():
    (code0, out0), (code1, out1) = _group("on")
    assert (code0, code1) == (0, 0), out0 + out1
    assert "rank 1 trained ['b1']" in out1
    idle = int(out0.rsplit("rank 0 idle items", 1)[1].split()[0])
    assert idle >= IDLE_S / TIMEOUT_S  # about one every TIMEOUT_S / 4


def test_without_the_keepalive_the_idle_rank_times_out():
    _, (code1, out1) = _group("off")
    assert code1 != 0, out1
    assert "rank 1 trained" not in out1
    assert "timed out" in out1.lower() or "timeout" in out1.lower(), out1[-2000:]

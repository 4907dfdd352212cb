"""A producer process for the kill -9 tests: `record` spools steps, `deliver` delivers a spool.

    python -m tests.support.record_steps record BOOTSTRAP DATA_DIR TRAJECTORIES STEPS
    python -m tests.support.record_steps deliver BOOTSTRAP DATA_DIR [--die-after N]
    python -m tests.support.record_steps stream BOOTSTRAP DATA_DIR

`stream` records one long trajectory (`traj-stream`) and prints `DURABLE n` each time
`flush(until="spooled")` confirmed the first n steps: what the caller was told is safe.

`--die-after N` sends SIGKILL to this very process right after the broker acknowledged the N-th
chunk and *before* the spool cursor moved: a kill -9 inside the in-doubt window, deterministically.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

from producers.sdk.delivery import SpoolDelivery
from producers.sdk.recorder import AgentRecorder


def _say(*parts: object) -> None:
    """A line for the parent test to read at once (this child process talks over stdout)."""
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


def record(bootstrap: str, data_dir: str, trajectories: int, steps: int) -> int:
    rec = AgentRecorder(bootstrap, data_dir, agent="kill9", model="m", chunk_records=10, close_timeout_s=1)
    for t in range(trajectories):
        with rec.episode(task_id=f"task-{t}", trajectory_id=f"traj-{t}") as ep:
            for i in range(steps):
                ep.step(tool="bash", params={"i": i}, observation="o" * 2048)
            ep.end(success=True)
    ok = rec.flush(30, until="spooled")
    _say("SPOOLED" if ok else "NOT SPOOLED")
    rec.close(1)
    return 0 if ok else 1


def deliver(bootstrap: str, data_dir: str, die_after: int | None) -> int:
    if die_after is not None:
        original = SpoolDelivery._send
        chunks = []

        def send_then_die(self, records):
            original(self, records)
            chunks.append(len(records))
            if len(chunks) >= die_after:
                _say("KILLING MYSELF after", sum(chunks), "acknowledged records")
                os.kill(os.getpid(), signal.SIGKILL)

        SpoolDelivery._send = send_then_die
    rec = AgentRecorder(bootstrap, data_dir, agent="kill9", chunk_records=10)
    _say("DELIVERING", rec.pending)
    ok = rec.flush(60)
    _say("DELIVERED" if ok else "NOT DELIVERED", rec.pending)
    rec.close(5)
    return 0 if ok else 1


def stream(bootstrap: str, data_dir: str) -> int:
    rec = AgentRecorder(bootstrap, data_dir, agent="kill9", chunk_records=10)
    ep = rec.episode(task_id="stream", trajectory_id="traj-stream")
    for i in range(100_000):
        ep.step(tool="bash", params={"i": i}, observation="o" * 2048)
        if (i + 1) % 50 == 0 and rec.flush(30, until="spooled"):
            _say("DURABLE", i + 1)
            time.sleep(0.01)  # an agent thinks between steps; lets the delivery thread run
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    mode, bootstrap, data_dir, *rest = sys.argv[1:]
    if mode == "record":
        sys.exit(record(bootstrap, data_dir, int(rest[0]), int(rest[1])))
    if mode == "stream":
        sys.exit(stream(bootstrap, data_dir))
    sys.exit(deliver(bootstrap, data_dir, int(rest[1]) if rest[:1] == ["--die-after"] else None))

"""Fixtures of the export integration tests: a chDB filled through the real sink row mapping with
scored trajectories (in a child process: the test process never opens chDB), and a runner for the
`agentstream export` command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from schemas.codec import encode
from schemas.events import TrajectoryScored
from tests.support.processes import AGENTSTREAM, REPO
from tests.support.trainer_data import scored, step, synthetic

WRITER = """
import sys
from clients.clickhouse.client import connect
from clients.clickhouse.migrate import migrate
from consumers.sink.clickhouse import ClickHouseSink
from consumers.sink.rows import rows_for
from schemas.codec import decode
from schemas.records import Record
from schemas.topics import topic_for

client = connect(sys.argv[1])
migrate(client)
sink = ClickHouseSink(client)
for offset, line in enumerate(open(sys.argv[2], "rb")):
    raw = line.rstrip(b"\\n")
    event = decode(raw)
    topic, partition = topic_for(event.type), offset % 2
    for table, row in rows_for(event, raw, topic, partition, offset):
        sink.add(table, row, Record(topic, partition, offset))
assert not sink.flush()
client.close()
"""

TASKS = 40  # enough tasks that every split of 0.8 / 0.1 / 0.1 gets some (seed 0: 33 / 5 / 2)


def trajectories() -> list[TrajectoryScored]:
    """40 tasks x 4 rollouts, plus: an older revision (superseded), an incomplete trajectory and
    one scored by another reward version (both must stay out of a `--reward-version rules-1` export)."""
    out = synthetic(TASKS * 4)
    first = out[0]
    out.insert(0, first.model_copy(update={"revision": 0, "event_id": "ev-old", "total_reward": 0.0}))
    out[1] = first.model_copy(update={"revision": 1, "event_id": "ev-new"})
    body = [step("look", "bash", "ok", 0.5, cmd="ls")]
    out.append(scored("traj-incomplete", "task-incomplete", 0.9, body, complete=False))
    other = scored("traj-v2", "task-v2", 0.9, body)
    out.append(other.model_copy(update={"reward_version": "rules-2"}))
    return out


@pytest.fixture(scope="session")
def stored_trajectories() -> list[TrajectoryScored]:
    """What `filled_chdb` holds (as events, before the table keeps the latest revision)."""
    return trajectories()


@pytest.fixture(scope="session")
def filled_chdb(tmp_path_factory) -> str:
    """A chDB URL holding `trajectories()` in agentstream.trajectories and agentstream.events."""
    root = tmp_path_factory.mktemp("export-chdb")
    events = root / "events.jsonl"
    events.write_bytes(b"".join(encode(e) + b"\n" for e in trajectories()))
    url = f"chdb://{root / 'clickhouse'}"
    done = subprocess.run(
        [sys.executable, "-c", WRITER, url, str(events)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return url


@pytest.fixture(scope="session")
def agentstream_export():
    """Run `agentstream export ARGS...`; returns the finished process (text output)."""

    def run(*args: str | Path) -> subprocess.CompletedProcess:
        argv = [*AGENTSTREAM, "export", *(str(a) for a in args)]
        return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)

    return run

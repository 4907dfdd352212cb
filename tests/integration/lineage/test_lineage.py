"""Integration: policy.updated, batch.built, trajectory.scored and step.recorded rows written through
the real sink row mapping and ClickHouseSink into chDB (in a child process: the test process never
opens chDB), then `agentstream lineage` reads them back: parent, metrics, batches, and every step
event id with the version that produced it. A re-published policy.updated stays one row."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from schemas.codec import encode
from schemas.events import BatchBuilt, PolicyUpdated, StepRecorded, TrajectoryScored
from tests.support.processes import AGENTSTREAM, REPO

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 1, tzinfo=UTC)
ENV = {"occurred_at": T0, "producer": "test"}

WRITER = """
import sys
from clients.clickhouse.client import connect
from clients.clickhouse.migrate import migrate
from consumers.sink.clickhouse import ClickHouseSink
from consumers.sink.rows import rows_for
from schemas.codec import decode
from schemas.records import Record

client = connect(sys.argv[1])
migrate(client)
sink = ClickHouseSink(client)
for offset, line in enumerate(open(sys.argv[2], "rb")):
    raw = line.rstrip(b"\\n")
    event = decode(raw)
    for table, row in rows_for(event, raw, "t", 0, offset):
        sink.add(table, row, Record("t", 0, offset))
assert not sink.flush()
client.close()
"""


def _events() -> list:
    steps = [
        StepRecorded(event_id=f"s-{t}-{i}", trajectory_id=t, step_index=i, policy_version=pv, **ENV)
        for t, pv in (("t1", "v1"), ("t2", None))
        for i in range(2)
    ]
    scored = [
        TrajectoryScored(event_id=f"ts-{t}", trajectory_id=t, task_id="k", policy_version=pv, **ENV)
        for t, pv in (("t1", "v1"), ("t2", None))
    ]
    batch = BatchBuilt(
        event_id="bb-1", trajectory_id="b1", batch_id="b1", kind="grpo", path="/x.jsonl", row_count=2,
        trajectory_ids=["t1", "t2"], source_ranges={"trajectory.scored": {"0": [4, 9]}}, **ENV,
    )  # fmt: skip
    update = PolicyUpdated(
        event_id="pu-2", trajectory_id="v2", policy_version="v2", previous_version="v1", method="grpo",
        step=7, batch_ids=["b1"], metrics={"loss": 0.5, "ess": 0.9, "is_ratio_max": 1.3},
        source_ranges={"trajectory.scored": {"0": [4, 9]}}, trajectory_ids=["t1", "t2"],
        behaviour_versions=["v1"], staleness_histogram={"1": 1, "0": 1}, dropped_groups=1, **ENV,
    )  # fmt: skip
    republished = update.model_copy(update={"occurred_at": datetime(2026, 11, 2, tzinfo=UTC)})
    return [*steps, *scored, batch, update, republished]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_lineage_lists_what_trained_a_version_down_to_step_events(tmp_path):
    url = f"chdb://{tmp_path / 'clickhouse'}"
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"".join(encode(e) + b"\n" for e in _events()))
    written = _run(sys.executable, "-c", WRITER, url, str(events))
    assert written.returncode == 0, written.stderr[-3000:]

    out = _run(*AGENTSTREAM, "lineage", "v2", "--json", "--clickhouse-url", url)
    assert out.returncode == 0, out.stderr[-3000:]
    lineage = json.loads(out.stdout)
    version = lineage["version"]
    assert (version["previous_version"], version["method"], version["step"]) == ("v1", "grpo", 7)
    assert version["loss"] == 0.5 and version["kl"] is None and version["dropped_groups"] == 1
    assert version["staleness_histogram"] == {"0": 1, "1": 1}
    assert version["source_ranges"] == {"trajectory.scored": {"0": [4, 9]}}
    assert [(b["batch_id"], b["kind"]) for b in lineage["batches"]] == [("b1", "grpo")]
    assert [s["event_id"] for s in lineage["steps"]] == ["s-t1-0", "s-t1-1", "s-t2-0", "s-t2-1"]
    assert lineage["steps_by_policy_version"] == {"": 2, "v1": 2}

    table = _run(*AGENTSTREAM, "lineage", "v2", "--limit", "1", "--clickhouse-url", url)
    assert table.returncode == 0, table.stderr[-3000:]
    assert "v2 <- parent v1: grpo" in table.stdout and "s-t1-0" in table.stdout
    assert "s-t2-1" not in table.stdout and "3 more" in table.stdout

    missing = _run(*AGENTSTREAM, "lineage", "v9", "--clickhouse-url", url)
    assert missing.returncode == 1 and "'v9'" in missing.stderr and "Traceback" not in missing.stderr

    count = _run(*AGENTSTREAM, "sql", "SELECT count() AS n FROM agentstream.policy_versions FINAL",
                 "--format", "json", "--clickhouse-url", url)  # fmt: skip
    assert json.loads(count.stdout) == [{"n": 1}]

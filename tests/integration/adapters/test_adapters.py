"""`agentstream ingest` against the real embedded broker: valid files land, invalid ones are
reported and dead-lettered, and re-ingesting a file publishes the same event ids."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from producers.adapters.ingest import convert_file
from schemas.codec import decode
from schemas.topics import AGENT_EVENTS, DLQ
from tests.support.processes import AGENTSTREAM, REPO

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "adapters"
VALID = [
    "swe_agent/marshmallow-code__marshmallow-1867.traj",
    "openhands/session_trajectory.json",
    "openai/finetune.jsonl",
]


def read_topic(bootstrap: str, topic: str, timeout_s: float = 20.0) -> list:
    """Every record of `topic`, read from the beginning up to the end offsets."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        records, deadline = [], time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in partitions) and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()


def ingest(bootstrap: str, *paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*AGENTSTREAM, "ingest", *map(str, paths), "--bootstrap-servers", bootstrap, "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=180,
    )


def test_ingest_lands_valid_files_rejects_invalid_and_is_idempotent(broker, tmp_path):
    files = []
    for relative in VALID:
        target = tmp_path / relative.replace("/", "__")
        shutil.copy(FIXTURES / relative, target)
        files.append(target)
    bad = tmp_path / "broken.json"
    shutil.copy(FIXTURES / "invalid/truncated.json", bad)

    first = ingest(broker.bootstrap, *files, bad)
    assert first.returncode == 1, first.stderr
    summary = json.loads(first.stdout)
    assert (summary["files"], summary["files_ok"], summary["rejected"], summary["dead_letters"]) == (
        4,
        3,
        1,
        1,
    )

    expected = [
        e for f in files for e in convert_file(f, f.read_bytes(), datetime.now(UTC)).events
    ]  # ids do not depend on mtime, so this is what must have landed
    records = read_topic(broker.bootstrap, AGENT_EVENTS)
    landed = [decode(r.value) for r in records]
    assert sorted(e.event_id for e in landed) == sorted(e.event_id for e in expected)
    assert summary["events_published"] == len(expected) == (1 + 7 + 1) + (1 + 6 + 1) + (3 + 4)
    assert all(r.key.decode() == decode(r.value).trajectory_id for r in records)
    for trajectory_id in {e.trajectory_id for e in landed}:  # in order within each trajectory
        kinds = [e.type for e in landed if e.trajectory_id == trajectory_id]
        assert kinds[0] == "episode.started" and kinds[-1] == "episode.ended"
        indexes = [
            e.step_index for e in landed if e.trajectory_id == trajectory_id and e.type == "step.recorded"
        ]
        assert indexes == list(range(len(indexes)))

    [letter] = [decode(r.value) for r in read_topic(broker.bootstrap, DLQ)]
    assert (letter.stage, letter.source_key, letter.source_topic) == ("ingest", str(bad), None)
    assert str(bad) in letter.reason and "not valid JSON" in letter.reason
    assert letter.payload == bad.read_text()

    second = ingest(broker.bootstrap, files[0])
    assert second.returncode == 0, second.stdout + second.stderr
    again = [decode(r.value) for r in read_topic(broker.bootstrap, AGENT_EVENTS)]
    assert len(again) == len(landed) + 9
    assert {e.event_id for e in again} == {e.event_id for e in landed}, "re-ingest publishes the same ids"

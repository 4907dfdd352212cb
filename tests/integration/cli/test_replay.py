"""`agentstream replay` on real components (issue #17): rule rewards recomputed from `agent.events`
by a separate consumer group, the sink writing them into chDB.

- under the live version: every derived row in ClickHouse is reproduced exactly (the tables,
  compared whole, are the same before and after; the topic holds the same events twice);
- under a new version: rows with that version are added, the old ones stay, both queryable;
- `--since` reads only records at or after the time; unknown and not-yet-replayable roles are errors;
- the assembler per rule version: a live assembler (rules-1) never takes a replay's rules-2 rewards,
  even when they come first, and `--roles assembler` under rules-2 assembles from those only.
"""

from __future__ import annotations

import random
import subprocess
from datetime import UTC, datetime

import orjson
import pytest

from clients.kafka import ensure_topics, read_to_end
from schemas.topics import REWARD_RULE, TRAINING_BATCHES, TRAJECTORY_SCORED
from tests.support.processes import AGENTSTREAM, Proc, wait_for
from tests.support.sink_harness import group_caught_up, publish, reader, rows, scalar, snapshot, start_sink
from tests.support.streams_helpers import make_trajectory, worker_args

pytestmark = pytest.mark.integration

TRAJECTORIES, STEPS = 12, 5


def _replay(bootstrap: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            *AGENTSTREAM,
            "replay",
            "--bootstrap-servers",
            bootstrap,
            "--data-dir",
            str(tmp_path / "data"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )


def _rule_events(bootstrap: str) -> list[dict]:
    return [orjson.loads(r.value) for r in read_to_end(bootstrap, [REWARD_RULE])]


def _without_offsets(tables: dict[str, list[tuple]]) -> dict[str, list[tuple]]:
    """The snapshot less `events.offset` (the raw-event log says where the row was last read from,
    which for a replayed event is its newer copy: id, type, content and partition are the same) and
    less the replays' registry (each run that completes says so: `reward.version.completed`)."""
    offset = 8  # event_id, type, schema_version, trajectory_id, occurred_at, producer, topic, partition
    events = [
        row[:offset] + row[offset + 1 :] for row in tables["events"] if row[1] != "reward.version.completed"
    ]
    return {**tables, "events": events, "reward_versions": []}


def _publish_trajectories(bootstrap: str, prefix: str) -> None:
    ensure_topics(bootstrap)  # every source topic with the same partitions, as `agentstream up` makes them
    rng = random.Random(7)
    events = [e for i in range(TRAJECTORIES) for e in make_trajectory(f"{prefix}{i}", STEPS, rng)]
    publish(bootstrap, events)


def test_replay_reproduces_the_rule_rows_and_a_new_version_adds_its_own(broker, clickhouse_url, tmp_path):
    _publish_trajectories(broker.bootstrap, "r")
    first = _replay(broker.bootstrap, tmp_path, "--roles", "rules", "--reward-version", "rules-1")
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"{TRAJECTORIES * (STEPS + 2):,} records" in first.stdout  # the plan counts what it reads
    assert "lag 0" in first.stderr  # the progress reports the end
    live = _rule_events(broker.bootstrap)
    assert len(live) == TRAJECTORIES * STEPS and {e["reward_version"] for e in live} == {"rules-1"}

    sink = start_sink(broker.bootstrap, clickhouse_url, tmp_path / "sink")
    try:
        client = reader(clickhouse_url)
        count = "SELECT count() FROM agentstream.rule_rewards FINAL"
        wait_for(lambda: scalar(client, count) == TRAJECTORIES * STEPS, what="the live rule rewards")
        before = snapshot(client)

        again = _replay(broker.bootstrap, tmp_path, "--reward-version", "rules-1", "--from-beginning")
        assert again.returncode == 0, again.stderr[-3000:]
        replayed = _rule_events(broker.bootstrap)
        assert len(replayed) == 2 * len(live)  # published again ...
        assert {orjson.dumps(e) for e in replayed} == {orjson.dumps(e) for e in live}  # ... identical
        wait_for(lambda: group_caught_up(broker.bootstrap), what="the sink to read the replay")
        assert _without_offsets(snapshot(client)) == _without_offsets(before)  # every row the same

        new = _replay(broker.bootstrap, tmp_path, "--reward-version", "rules-2")
        assert new.returncode == 0, new.stderr[-3000:]
        wait_for(lambda: scalar(client, count) == 2 * TRAJECTORIES * STEPS, what="the rules-2 rows")
        by_version = rows(
            client,
            "SELECT reward_version, count(), round(avg(score), 6) FROM agentstream.rule_rewards FINAL "
            "GROUP BY reward_version ORDER BY reward_version",
        )
        assert [(v, n) for v, n, _ in by_version] == [("rules-1", 60), ("rules-2", 60)]
        assert by_version[0][2] == by_version[1][2]  # same logic, new label: the same scores
        after = snapshot(client)["rule_rewards"]
        assert [r for r in after if "rules-1" in r] == before["rule_rewards"]  # the old rows, unchanged
    finally:
        sink.proc.stop()


def test_replay_since_reads_only_later_records(broker, tmp_path):
    _publish_trajectories(broker.bootstrap, "early")
    cut = datetime.now(UTC)
    _publish_trajectories(broker.bootstrap, "late")
    done = _replay(broker.bootstrap, tmp_path, "--reward-version", "rules-9", "--since", cut.isoformat())
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{TRAJECTORIES * (STEPS + 2):,} records" in done.stdout  # the late half's events only
    scored = {e["trajectory_id"] for e in _rule_events(broker.bootstrap)}
    assert scored == {f"late{i}" for i in range(TRAJECTORIES)}


@pytest.mark.parametrize(
    ("roles", "message"),
    [("rules,nope", "unknown role 'nope'"), ("", "name at least one role")],
)
def test_replay_refuses_roles_it_cannot_replay(broker, tmp_path, roles, message):
    done = _replay(broker.bootstrap, tmp_path, "--roles", roles, "--reward-version", "v2")
    assert done.returncode != 0
    assert message in done.stderr and "Traceback" not in done.stderr


def test_a_trainer_replay_under_the_same_version_rebuilds_the_same_batches(broker, clickhouse_url, tmp_path):
    """Rules, assembler and trainer replayed from offset 0 under rules-1. Again into the same data
    directory: the trainer finds its batches built (manifests) and every table stays the same. Into a
    fresh one: it rebuilds them, with the same ids and the same content (sha256, rows)."""
    _publish_trajectories(broker.bootstrap, "b")
    roles = ("--roles", "rules,assembler,trainer", "--reward-version", "rules-1", "--grace-seconds", "3")
    first = _replay(broker.bootstrap, tmp_path, *roles)
    assert first.returncode == 0, first.stderr[-3000:]
    built = _batches(broker.bootstrap)
    assert built and all(b["reward_versions"] == ["assembly-1+rules-1"] for b in built.values())
    sink = start_sink(broker.bootstrap, clickhouse_url, tmp_path / "sink")
    try:
        client = reader(clickhouse_url)
        wait_for(lambda: group_caught_up(broker.bootstrap), what="the sink to read the first run")
        before = snapshot(client)
        assert len(before["batches"]) == len(built)
        again = _replay(broker.bootstrap, tmp_path, *roles)
        assert again.returncode == 0, again.stderr[-3000:]
        assert _batches(broker.bootstrap) == built  # nothing new: the same batches, found built
        wait_for(lambda: group_caught_up(broker.bootstrap), what="the sink to read the replay")
        assert _without_offsets(snapshot(client)) == _without_offsets(before)
    finally:
        sink.proc.stop()
    fresh = _replay(broker.bootstrap, tmp_path / "fresh", *roles)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    rebuilt = [orjson.loads(r.value) for r in read_to_end(broker.bootstrap, [TRAINING_BATCHES])]
    elsewhere = [b for b in rebuilt if str(tmp_path / "fresh") in b["path"]]
    same = ("batch_id", "kind", "sha256", "row_count", "trajectory_ids", "reward_versions")
    assert sorted(tuple(str(b[k]) for k in same) for b in elsewhere) == sorted(
        tuple(str(b[k]) for k in same) for b in built.values()
    )


def _batches(bootstrap: str) -> dict[str, dict]:
    return {
        b["event_id"]: b for b in (orjson.loads(r.value) for r in read_to_end(bootstrap, [TRAINING_BATCHES]))
    }


def _scored(bootstrap: str) -> list[dict]:
    return [orjson.loads(r.value) for r in read_to_end(bootstrap, [TRAJECTORY_SCORED])]


def test_the_live_assembler_takes_only_its_versions_rule_rewards(broker, tmp_path):
    _publish_trajectories(broker.bootstrap, "v")
    first = _replay(broker.bootstrap, tmp_path, "--roles", "rules", "--reward-version", "rules-2")
    assert first.returncode == 0, first.stderr[-3000:]  # rules-2 rewards now come first on reward.rule
    live = Proc(
        worker_args(broker.bootstrap, tmp_path / "live", "rules,assembler", "--grace-seconds", "120"),
        tmp_path / "live.log",
    )
    try:
        wait_for(
            lambda: (
                len({t["trajectory_id"] for t in _scored(broker.bootstrap) if t["complete"]}) == TRAJECTORIES
            ),
            timeout_s=120,
            what=f"the live trajectories\n{live.log_text()[-3000:]}",
        )
        live_scored = _scored(broker.bootstrap)
        assert {t["reward_version"] for t in live_scored} == {"assembly-1+rules-1"}
        assert {t["revision"] for t in live_scored} == {0}  # one emission each: no rules-2 slot taken

        again = _replay(
            broker.bootstrap,
            tmp_path,
            "--roles",
            "assembler",
            "--reward-version",
            "rules-2",
            "--grace-seconds",
            "3",
        )
        assert again.returncode == 0, again.stderr[-3000:]
        scored = _scored(broker.bootstrap)
        new = [t for t in scored if t["reward_version"] == "assembly-1+rules-2"]
        assert sorted(t["trajectory_id"] for t in new) == sorted(f"v{i}" for i in range(TRAJECTORIES))
        assert all(t["complete"] and t["revision"] == 0 for t in new)
        assert {t["event_id"] for t in new}.isdisjoint(
            {t["event_id"] for t in live_scored}
        )  # the version is in the id
        assert [
            t for t in scored if t["reward_version"] != "assembly-1+rules-2"
        ] == live_scored  # live: untouched
    finally:
        live.stop()

"""`agentstream replay` on real components (issue #17): rule rewards and scored trajectories
recomputed from `agent.events` by the `scoring` role under a separate consumer group, the sink
writing them into chDB.

- under the live version: every derived row in ClickHouse is reproduced exactly (the tables,
  compared whole, are the same before and after; the topic holds the same events twice);
- under a new version: rows with that version are added, the old ones stay, both queryable;
- `--since` reads only records at or after the time; unknown roles, and the `rules` / `assembler`
  roles merged into `scoring`, are errors naming the value;
- beside a live `scoring` worker, a replay under a new rule profile and version adds its own
  trajectories and leaves the live ones untouched.
"""

from __future__ import annotations

import random
import subprocess
import time
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
GRACE = ("--grace-seconds", "3")  # every trajectory is complete: nothing waits for the grace period


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
    first = _replay(broker.bootstrap, tmp_path, "--roles", "scoring", "--reward-version", "rules-1", *GRACE)
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"{TRAJECTORIES * (STEPS + 2):,} records" in first.stdout  # the plan counts what it reads
    assert "lag 0" in first.stderr  # the progress reports the end
    live = _rule_events(broker.bootstrap)
    assert len(live) == TRAJECTORIES * STEPS and {e["reward_version"] for e in live} == {"rules-1"}
    assert len(_scored(broker.bootstrap)) == TRAJECTORIES  # scoring assembles them too

    sink = start_sink(broker.bootstrap, clickhouse_url, tmp_path / "sink")
    try:
        client = reader(clickhouse_url)
        count = "SELECT count() FROM agentstream.rule_rewards FINAL"
        wait_for(lambda: scalar(client, count) == TRAJECTORIES * STEPS, what="the live rule rewards")
        before = snapshot(client)

        again = _replay(broker.bootstrap, tmp_path, "--reward-version", "rules-1", "--from-beginning", *GRACE)
        assert again.returncode == 0, again.stderr[-3000:]
        replayed = _rule_events(broker.bootstrap)
        assert len(replayed) == 2 * len(live)  # published again ...
        assert {orjson.dumps(e) for e in replayed} == {orjson.dumps(e) for e in live}  # ... identical
        wait_for(lambda: group_caught_up(broker.bootstrap), what="the sink to read the replay")
        assert _without_offsets(snapshot(client)) == _without_offsets(before)  # every row the same

        new = _replay(broker.bootstrap, tmp_path, "--reward-version", "rules-2", *GRACE)
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
    done = _replay(
        broker.bootstrap, tmp_path, "--reward-version", "rules-9", "--since", cut.isoformat(), *GRACE
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{TRAJECTORIES * (STEPS + 2):,} records" in done.stdout  # the late half's events only
    scored = {e["trajectory_id"] for e in _rule_events(broker.bootstrap)}
    assert scored == {f"late{i}" for i in range(TRAJECTORIES)}


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        ("scoring,nope", "unknown role 'nope'"),
        ("", "name at least one role"),
        ("rules,assembler", "'rules' is no longer a role"),
        ("assembler", "--roles scoring"),
    ],
)
def test_replay_refuses_roles_it_cannot_replay(broker, tmp_path, roles, message):
    done = _replay(broker.bootstrap, tmp_path, "--roles", roles, "--reward-version", "v2")
    assert done.returncode != 0
    assert message in done.stderr and "Traceback" not in done.stderr


def test_a_batch_replay_under_the_same_version_rebuilds_the_same_batches(broker, clickhouse_url, tmp_path):
    """Scoring and the batch builder replayed from offset 0 under rules-1. Again into the same data
    directory (asked by the role's old name, `trainer`, which says it is renamed): the batch builder
    finds its batches built (manifests) and every table stays the same. Into a fresh one: it rebuilds
    them, with the same ids and the same content (sha256, rows)."""
    _publish_trajectories(broker.bootstrap, "b")
    roles = ("--roles", "scoring,batch", "--reward-version", "rules-1", *GRACE)
    first = _replay(broker.bootstrap, tmp_path, *roles)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "is now" not in first.stderr and "batch: done" in first.stderr
    built = _batches(broker.bootstrap)
    assert built and all(b["reward_versions"] == ["assembly-1+rules-1"] for b in built.values())
    sink = start_sink(broker.bootstrap, clickhouse_url, tmp_path / "sink")
    try:
        client = reader(clickhouse_url)
        wait_for(lambda: group_caught_up(broker.bootstrap), what="the sink to read the first run")
        before = snapshot(client)
        assert len(before["batches"]) == len(built)
        old_name = ("--roles", "scoring,trainer", *roles[2:])
        again = _replay(broker.bootstrap, tmp_path, *old_name)
        assert again.returncode == 0, again.stderr[-3000:]
        notes = [line for line in again.stderr.splitlines() if "is now" in line]
        assert len(notes) == 1 and notes[0].startswith("agentstream: replay role `trainer` is now `batch`")
        assert _batches(broker.bootstrap) == built  # nothing new: the same batches, found built
        wait_for(lambda: group_caught_up(broker.bootstrap), what="the sink to read the replay")
        assert _without_offsets(snapshot(client)) == _without_offsets(before)
    finally:
        sink.proc.stop()
    fresh = _replay(broker.bootstrap, tmp_path / "fresh", *roles)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    rebuilt = _batches(broker.bootstrap).values()
    elsewhere = [b for b in rebuilt if str(tmp_path / "fresh") in b["path"]]
    same = (
        "batch_id",
        "kind",
        "sha256",
        "rows_sha256",
        "chunks",
        "row_count",
        "trajectory_ids",
        "reward_versions",
    )
    assert sorted(tuple(str(b[k]) for k in same) for b in elsewhere) == sorted(
        tuple(str(b[k]) for k in same) for b in built.values()
    )


def _batches(bootstrap: str) -> dict[str, dict]:
    """The batch.built events (the batch.rows chunks before each are left out)."""
    records = (orjson.loads(r.value) for r in read_to_end(bootstrap, [TRAINING_BATCHES]))
    return {b["event_id"]: b for b in records if b["type"] == "batch.built"}


def _scored(bootstrap: str) -> list[dict]:
    return [orjson.loads(r.value) for r in read_to_end(bootstrap, [TRAJECTORY_SCORED])]


PROFILES = """\
domain: coding
extends: coding
reward_weights: {outcome: 0.1, process: 0.8, efficiency: 0.1}
"""


def test_a_replay_under_a_new_profile_beside_the_live_scoring_leaves_it_untouched(broker, tmp_path):
    """The live `scoring` worker (rules-1) runs throughout; `--roles scoring` under rules-2 with a
    changed profile adds a trajectory per trajectory, with new ids and the new weights' totals, and
    the live worker emits nothing new (it never reads `reward.rule`, where the replay's rewards go)."""
    _publish_trajectories(broker.bootstrap, "v")
    live = Proc(
        worker_args(broker.bootstrap, tmp_path / "live", "scoring", "--grace-seconds", "120"),
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
        assert {t["revision"] for t in live_scored} == {0}

        profiles = tmp_path / "profiles.yaml"
        profiles.write_text(PROFILES)
        again = _replay(
            broker.bootstrap, tmp_path, "--roles", "scoring", "--reward-version", "rules-2",
            "--profiles", str(profiles), *GRACE,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr[-3000:]
        assert "scoring: " in again.stderr and "lag 0" in again.stderr
        time.sleep(2.0)  # anything the live worker made of the replay's output would show up now
        scored = _scored(broker.bootstrap)
        new = {t["trajectory_id"]: t for t in scored if t["reward_version"] == "assembly-1+rules-2"}
        assert sorted(new) == sorted(f"v{i}" for i in range(TRAJECTORIES))
        assert all(t["complete"] and t["revision"] == 0 for t in new.values())
        assert {t["event_id"] for t in new.values()}.isdisjoint({t["event_id"] for t in live_scored})
        old = {t["trajectory_id"]: t["total_reward"] for t in live_scored}
        assert any(t["total_reward"] != old[tid] for tid, t in new.items())  # the new weights count
        assert [t for t in scored if t["reward_version"] != "assembly-1+rules-2"] == live_scored  # untouched
        assert {e["reward_version"] for e in _rule_events(broker.bootstrap)} == {"rules-1", "rules-2"}
    finally:
        live.stop()

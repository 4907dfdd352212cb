"""Reward versions side by side on real chDB (migration 0009, docs/reward-versions.md): a database at
version 8 with rows migrates and keeps them; a replay's version is added beside the live one; the
views, the leaderboard and the trajectory commands show the newest complete version unless told."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from clients.clickhouse.client import chdb_path, connect
from clients.clickhouse.migrate import load_migrations
from consumers.sink.rows import COLUMNS, rows_for
from infra.clickhouse.analytics import leaderboard_report
from infra.clickhouse.browse.filters import parse_filter
from infra.clickhouse.browse.trajectory_detail import trajectory_scores
from infra.clickhouse.browse.trajectory_list import trajectory_page
from infra.clickhouse.sql import run
from infra.clickhouse.versions import resolve_reward_version
from infra.errors import FilterError
from producers.reward_versions import completed_event
from schemas.codec import encode
from schemas.events import (
    EpisodeEnded,
    EpisodeStarted,
    RuleRewardStep,
    ScoredStep,
    StepRecorded,
    TrajectoryScored,
)
from tests.support.processes import AGENTSTREAM, Proc, free_port, wait_for

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]
T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
LIVE, REPLAY = "assembly-1+rules-1", "assembly-1+rules-2"
COMPARED = (
    "trajectory_id, revision, event_id, occurred_at, reward_version, total_reward, complete, steps, "
    "reward_definition, step_layers, missing_layers"
)

# Runs in a child process: chDB holds its path for the life of the process that opens it.
SETUP = r"""
import json, shutil, sys, tempfile
from pathlib import Path
from clients.clickhouse.client import connect
from clients.clickhouse.migrate import MIGRATIONS_DIR, migrate
from consumers.sink.rows import COLUMNS, rows_for
from schemas.codec import decode
url, upto, events_file, compared, out = sys.argv[1:]
old = Path(tempfile.mkdtemp())
for path in MIGRATIONS_DIR.glob("*.sql"):
    if int(path.name[:4]) <= int(upto):
        shutil.copy(path, old / path.name)
client = connect(url)
assert migrate(client, old) == list(range(1, int(upto) + 1))
tables = {t for (t,) in client.query("SHOW TABLES FROM agentstream").result_rows}
for line in Path(events_file).read_bytes().splitlines():
    for table, row in rows_for(decode(line), line, "test", 0, 0)[1:]:
        if table in tables:  # the rows an older sink wrote: the columns its version had
            have = {c for (c, *_) in client.query(f"DESCRIBE TABLE agentstream.{table}").result_rows}
            keep = [i for i, c in enumerate(COLUMNS[table]) if c in have]
            client.insert(f"agentstream.{table}", [[row[i] for i in keep]],
                          column_names=[COLUMNS[table][i] for i in keep])
before = client.query(f"SELECT {compared} FROM agentstream.trajectories FINAL ORDER BY trajectory_id")
Path(out).write_text(json.dumps([list(map(str, r)) for r in before.result_rows]))
client.close()
"""


def insert_events(client, events) -> None:
    """Each event's typed rows, mapped the way the sink maps them."""
    for event in events:
        for table, row in rows_for(event, encode(event), "test", 0, 0)[1:]:
            client.insert(f"agentstream.{table}", [list(row)], column_names=list(COLUMNS[table]))


def _trajectory(tid: str, revision: int, version: str, reward: float, at: datetime) -> TrajectoryScored:
    steps = [ScoredStep(step_index=i, rule_score=reward, process_score=reward) for i in range(2)]
    return TrajectoryScored(
        event_id=f"{tid}-{version}-{revision}", trajectory_id=tid, occurred_at=at, producer="assembler",
        task_id="k", domain="code", model=f"m-{tid}", policy_version="v1", success=True, steps=steps,
        total_steps=2, total_reward=reward, revision=revision, reward_version=version,
    )  # fmt: skip


def _episode(tid: str, at: datetime) -> list:
    return [
        EpisodeStarted(event_id=f"{tid}-s", trajectory_id=tid, occurred_at=at, producer="sdk", task_id="k",
                       domain="code", model=f"m-{tid}", policy_version="v1"),
        *[StepRecorded(event_id=f"{tid}-step{i}", trajectory_id=tid, occurred_at=at, producer="sdk",
                       step_index=i, tool="bash") for i in range(2)],
        EpisodeEnded(event_id=f"{tid}-e", trajectory_id=tid, occurred_at=at, producer="sdk", success=True,
                     score=0.1, total_steps=2),
    ]  # fmt: skip


def _rules(tid: str, version: str, score: float, at: datetime) -> list[RuleRewardStep]:
    return [
        RuleRewardStep(event_id=f"{tid}-r{i}-{version}", trajectory_id=tid, occurred_at=at, producer="rules",
                       step_index=i, score=score, domain="code", reward_version=version,
                       source_event_id=f"{tid}-step{i}")
        for i in range(2)
    ]  # fmt: skip


def v8_events() -> list:
    """What a live stack wrote before 0009: two trajectories, t1 in two revisions, rules-1."""
    t1, t2 = T0, T0 + timedelta(minutes=1)
    return [
        *_episode("t1", t1), *_episode("t2", t2), *_rules("t1", "rules-1", 0.5, t1),
        *_rules("t2", "rules-1", 0.5, t2), _trajectory("t1", 1, LIVE, 0.3, t1),
        _trajectory("t1", 2, LIVE, 0.4, t1), _trajectory("t2", 1, LIVE, 0.6, t2),
    ]  # fmt: skip


def replay_events() -> list:
    """A replay under rules-2 that covered t1 only (t2 came after its end offsets)."""
    return [*_rules("t1", "rules-2", 0.9, T0), _trajectory("t1", 1, REPLAY, 0.8, T0)]


def _cli(*args: str) -> str:
    out = subprocess.run([*AGENTSTREAM, *args], capture_output=True, text=True, timeout=90, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    """A database at version 8 with rows, migrated by `agentstream db migrate`, then served."""
    from tests.support.sink_harness import reader

    root = tmp_path_factory.mktemp("versions")
    url = f"chdb://{root / 'clickhouse'}"
    before, events = root / "before.json", root / "events.jsonl"
    events.write_bytes(b"".join(encode(e) + b"\n" for e in v8_events()))
    setup = [sys.executable, "-c", SETUP, url, "8", str(events), COMPARED, str(before)]
    done = subprocess.run(setup, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    migrated_now = _cli("db", "migrate", "--clickhouse-url", url)
    assert "applied migrations: 0009" in migrated_now, migrated_now
    port = free_port()
    server = Proc([*AGENTSTREAM, "db", "serve", "--clickhouse-url", url, "--port", str(port)], root / "s.log")
    try:
        wait_for(lambda: server.alive() and reader(url), timeout_s=60, what="agentstream db serve")
        client = connect(url, role="writer")  # the tests re-apply migrations and insert
        yield url, client, json.loads(before.read_text())
        client.close()
    finally:
        server.stop()


def _rows(client, sql: str, **params) -> list[tuple]:
    return list(client.query(sql, parameters=params or None).result_rows)


def test_a_database_at_version_8_keeps_its_rows_and_0009_runs_again(migrated):
    url, client, before = migrated
    if chdb_path(url) is None:
        pytest.skip("embedded-only")
    after = _rows(client, f"SELECT {COMPARED} FROM agentstream.trajectories FINAL ORDER BY trajectory_id")
    assert [list(map(str, r)) for r in after] == before and len(before) == 2
    assert [r[1] for r in after] == [2, 1]  # t1's latest revision survived the copy
    key = "SELECT sorting_key FROM system.tables WHERE database = 'agentstream' AND name = 'trajectories'"
    assert _rows(client, key) == [("trajectory_id, reward_version",)]
    stamped = "SELECT count() FROM agentstream.trajectories WHERE ingested_at != occurred_at"
    assert _rows(client, stamped) == [(0,)]  # old rows are first seen when they occurred
    (versions_0009,) = [m for m in load_migrations() if m.version == 9]
    for statement in versions_0009.statements():  # interrupted before it was recorded
        client.command(statement)
    for later in (m for m in load_migrations() if m.version > 9):  # then `migrate` goes on, as it would
        for statement in later.statements():  # (0009 rebuilt `trajectories`: 0014 adds `purpose` again)
            client.command(statement)
    again = _rows(client, f"SELECT {COMPARED} FROM agentstream.trajectories FINAL ORDER BY trajectory_id")
    assert again == after
    applied = "SELECT version FROM agentstream.schema_migrations FINAL ORDER BY version"
    assert [v for (v,) in _rows(client, applied)] == [m.version for m in load_migrations()]
    assert "schema up to date" in _cli("db", "migrate", "--clickhouse-url", url)


def test_0010_storage_settings_apply_to_an_upgraded_database_and_run_again(migrated):
    """Migration 0010 (LZ4 on the observation columns, merge base 20): applied by the upgrade above,
    and safe to run again (a migration interrupted before it was recorded)."""
    _url, client, _ = migrated
    (lighter,) = [m for m in load_migrations() if m.version == 10]
    for statement in lighter.statements():
        client.command(statement)
    codecs = _rows(
        client,
        "SELECT table, name, compression_codec FROM system.columns WHERE database = 'agentstream' "
        "AND (table, name) IN (('events', 'raw'), ('steps', 'observation'), ('trajectories', 'steps')) "
        "ORDER BY table",
    )
    assert [(t, c) for t, _, c in codecs] == [(t, "CODEC(LZ4)") for t in ("events", "steps", "trajectories")]
    created = (
        "SELECT create_table_query FROM system.tables WHERE database = 'agentstream' AND name = {t:String}"
    )
    for table in ("events", "steps", "rule_rewards", "trajectories"):
        assert "merge_selector_base = 20" in _rows(client, created, t=table)[0][0], table


def test_0011_small_parts_are_packed_in_one_file_and_read_back(migrated):
    """Migration 0011 (packed storage below 10 MiB): applied by the upgrade, safe to run again, and a
    fresh insert into a table with the setting writes one `data.packed` part that reads back."""
    _url, client, _ = migrated
    (packed,) = [m for m in load_migrations() if m.version == 11]
    for statement in packed.statements():
        client.command(statement)
    created = (
        "SELECT create_table_query FROM system.tables WHERE database = 'agentstream' AND name = {t:String}"
    )
    for table in ("events", "episodes", "steps", "rule_rewards", "trajectories", "batches"):
        assert "min_bytes_for_full_part_storage = 10485760" in _rows(client, created, t=table)[0][0], table
    client.command("CREATE TABLE agentstream.packed_probe AS agentstream.rule_rewards")
    try:
        row = rows_for(_rules("probe", "rules-9", 0.7, T0)[0], b"{}", "test", 0, 0)[1][1]
        client.insert("agentstream.packed_probe", [list(row)], column_names=list(COLUMNS["rule_rewards"]))
        parts = "SELECT part_storage_type FROM system.parts WHERE table = 'packed_probe' AND active"
        assert _rows(client, parts) == [("Packed",)]
        assert _rows(client, "SELECT trajectory_id, score FROM agentstream.packed_probe FINAL") == [
            ("probe", 0.7)
        ]
    finally:
        client.command("DROP TABLE agentstream.packed_probe")


def test_a_replay_version_sits_beside_the_live_one_and_becomes_the_default(migrated):
    _, client, _ = migrated
    assert _rows(client, "SELECT reward_version FROM agentstream.reward_version_default") == [(LIVE,)]
    insert_events(client, replay_events())
    both = "SELECT reward_version, count() FROM agentstream.trajectories FINAL GROUP BY 1 ORDER BY 1"
    assert _rows(client, both) == [(LIVE, 2), (REPLAY, 1)]
    versions = (
        "SELECT reward_version, trajectories, live, complete FROM agentstream.trajectory_versions ORDER BY 1"
    )
    assert _rows(client, versions) == [(LIVE, 2, 1, 1), (REPLAY, 1, 0, 0)]
    # not complete yet (no reward.version.completed): the views stay on the live version
    assert _rows(client, "SELECT reward_version FROM agentstream.reward_version_default") == [(LIVE,)]
    outcomes = "SELECT trajectory_id, reward, reward_version FROM agentstream.episode_outcomes ORDER BY 1"
    assert _rows(client, outcomes) == [("t1", 0.4, LIVE), ("t2", 0.6, LIVE)]

    insert_events(client, [completed_event("rules-2", ["rules", "assembler"], {("agent.events", 0): 12}, T0)])
    assert _rows(client, "SELECT reward_version FROM agentstream.reward_version_default") == [(REPLAY,)]
    # one row per episode still; t2, which the replay did not cover, keeps its episode score
    assert _rows(client, outcomes) == [("t1", 0.8, REPLAY), ("t2", 0.1, None)]
    at_live = (
        "SELECT trajectory_id, reward FROM agentstream.episode_outcomes_at(reward_version = {v:String}) "
        "ORDER BY 1"
    )
    assert _rows(client, at_live, v=LIVE) == [("t1", 0.4), ("t2", 0.6)]
    board = "SELECT model, mean_reward FROM agentstream.leaderboard ORDER BY model"
    assert _rows(client, board) == [("m-t1", 0.8), ("m-t2", 0.1)]
    board_at = (
        "SELECT model, mean_reward, reward_version "
        "FROM agentstream.leaderboard_at(reward_version = {v:String})"
    )
    assert _rows(client, board_at + " ORDER BY model", v=LIVE) == [("m-t1", 0.4, LIVE), ("m-t2", 0.6, LIVE)]
    copy = "SELECT model, mean_reward FROM agentstream.leaderboard_snapshot ORDER BY model"
    client.command("SYSTEM REFRESH VIEW agentstream.leaderboard_snapshot_refresh")
    wait_for(lambda: _rows(client, copy) == _rows(client, board), 30, what="the snapshot")
    # each step and each trajectory counted once, whatever the number of versions
    assert _rows(client, "SELECT sum(calls) FROM agentstream.tool_usage") == [(4,)]
    assert _rows(client, "SELECT mean_rule_score FROM agentstream.reward_by_step ORDER BY step_index") == [
        (0.9,),
        (0.9,),
    ]  # t1's steps under rules-2 only (t2 has no rules-2 rewards)
    assert _rows(client, "SELECT episodes FROM agentstream.policy_version_stats") == [(1,)]
    # a replay of the live version writes its rows again, later than the rules-2 ones: still live
    insert_events(client, [e for e in v8_events() if e.type == "trajectory.scored"])
    live = "SELECT reward_version FROM agentstream.trajectory_versions WHERE live"
    assert _rows(client, live) == [(LIVE,)]
    rewritten = "SELECT min(ingested_at) > (SELECT max(ingested_at) FROM agentstream.trajectories "
    rewritten += f"WHERE reward_version = '{REPLAY}') FROM agentstream.trajectories FINAL "
    rewritten += f"WHERE reward_version = '{LIVE}'"
    assert _rows(client, rewritten) == [(1,)]  # what would have made rules-2 look first


def test_readers_default_to_the_newest_complete_version_and_take_another(migrated):
    _, client, _ = migrated

    def query(sql):
        return run(client, sql)

    choice, rows = leaderboard_report(query, "model")
    assert (choice.version, choice.how) == (REPLAY, "newest completed replay")
    assert [(r["model"], r["mean_reward"], r["reward_version"]) for r in rows] == [
        ("m-t1", 0.8, REPLAY),
        ("m-t2", 0.1, REPLAY),
    ]
    choice, rows = leaderboard_report(query, "model", reward_version="rules-1")
    assert choice.version == LIVE and [r["mean_reward"] for r in rows] == [0.6, 0.4]
    with pytest.raises(FilterError, match=r"reward_version='rules-9': no trajectories"):
        resolve_reward_version(query, "rules-9")
    page = trajectory_page(client, parse_filter({}))
    assert page["version"]["reward_version"] == REPLAY and [r["trajectory_id"] for r in page["rows"]] == [
        "t1"
    ]
    assert page["facets"]["reward_version"] == [LIVE, REPLAY]
    live_page = trajectory_page(client, parse_filter({"reward_version": "rules-1"}))
    assert live_page["total"] == 2 and "--reward-version" in live_page["version"]["text"]
    episode, steps = trajectory_scores(client, "t1")
    assert episode["reward_version"] == REPLAY and episode["total_reward"] == 0.8
    assert [s["rule"] for s in steps] == [0.9, 0.9] and sorted(episode["reward_versions"]) == [LIVE, REPLAY]
    episode, steps = trajectory_scores(client, "t1", "rules-1")
    assert episode["total_reward"] == 0.4 and [s["rule"] for s in steps] == [0.5, 0.5]
    episode, _ = trajectory_scores(client, "t2")  # not re-scored by the replay: its live version
    assert (episode["reward_version"], episode["reward_version_source"]) == (LIVE, "live")


def test_the_cli_names_the_version_it_shows(migrated):
    url, _, _ = migrated
    table = _cli("leaderboard", "--clickhouse-url", url, "--by", "model").splitlines()
    assert table[0].startswith(
        f"reward version: {REPLAY} (newest complete: replay of rules-2 completed 2026-"
    )
    given = json.loads(
        _cli("leaderboard", "--clickhouse-url", url, "--reward-version", "rules-1", "--format", "json")
    )
    assert {r["reward_version"] for r in given} == {LIVE} and len(given) == 2
    listing = json.loads(_cli("trajectories", "--clickhouse-url", url, "--format", "json"))
    assert listing["reward_version"] == REPLAY and listing["total"] == 1
    one = json.loads(
        _cli("trajectory", "t1", "--clickhouse-url", url, "--reward-version", LIVE, "--format", "json")
    )
    assert one["episode"]["reward_version"] == LIVE and one["episode"]["total_reward"] == 0.4
    unknown = subprocess.run(
        [*AGENTSTREAM, "leaderboard", "--clickhouse-url", url, "--reward-version", "rules-9"],
        capture_output=True, text=True, timeout=90, cwd=REPO,
    )  # fmt: skip
    assert unknown.returncode != 0 and "reward_version='rules-9'" in unknown.stderr

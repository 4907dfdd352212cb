"""Acceptance (#17): `agentstream replay --roles judge,scoring` beside a live stack.

Everything real: the embedded broker over TCP, a live `agentstream worker` (scoring, judge) whose
judge calls a local Messages-API server with the real anthropic SDK, the sink writing chDB, and
`agentstream replay` running its workers as child processes.

- Under the live version, from offset 0: every ClickHouse table is the same afterwards and the
  judge server gets no call (the replay's judge reads the live judge's reply cache).
- Under rules-2 (scoring alone, waiting for the live judge's results): `rule_rewards` holds both
  versions, `trajectory.scored` gets trajectories assembled under `assembly-1+rules-2`, and the live
  scoring (still running under rules-1) makes nothing new.
"""

from __future__ import annotations

import os
import random
import subprocess

import orjson
import pytest

from clients.kafka import ensure_topics
from schemas import topics
from tests.support.judge_servers.messages import MessagesServer
from tests.support.processes import AGENTSTREAM, Proc, wait_for
from tests.support.sink_harness import group_caught_up, reader, rows, scalar, snapshot, start_sink
from tests.support.streams_helpers import make_trajectory, publish, read_topic, worker_args

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRAJECTORIES, STEPS = 6, 3


def _env(server: MessagesServer) -> dict[str, str]:
    return {
        "ANTHROPIC_API_KEY": "dummy-key",
        "AGENTSTREAM_JUDGE_API_KEY": "",
        "AGENTSTREAM_JUDGE_BASE_URL": server.url,
        "AGENTSTREAM_JUDGE_RULES_PATH": "",
        "AGENTSTREAM_JUDGE_BACKOFF_BASE_S": "0.05",
    }


def _replay(bootstrap: str, tmp_path, env: dict, *args: str) -> subprocess.CompletedProcess:
    command = [*AGENTSTREAM, "replay", "--bootstrap-servers", bootstrap, "--data-dir", str(tmp_path / "r")]
    done = subprocess.run(
        [*command, "--grace-seconds", "3", "--timeout", "240", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def _scored(bootstrap: str) -> list[dict]:
    return [orjson.loads(e.model_dump_json()) for e in read_topic(bootstrap, topics.TRAJECTORY_SCORED)]


def _comparable(tables: dict[str, list[tuple]], columns: dict[str, list[str]]) -> dict[str, list[tuple]]:
    """The snapshot less `events.offset` (where the raw row was last read from: the newer copy).
    Judge rows stay whole: a reply served from the cache for the same targets is the call's own
    events again, tokens, cost and time included (streams/judge/cache.py `CallRecord`)."""
    offset, kind = columns["events"].index("offset"), columns["events"].index("type")
    events = [
        row[:offset] + row[offset + 1 :]
        for row in tables["events"]
        if row[kind] != "reward.version.completed"
    ]
    return {**tables, "events": events, "reward_versions": []}  # each completed run registers itself


def _columns(client, table: str) -> list[str]:
    found = rows(
        client,
        f"SELECT name FROM system.columns WHERE database = 'agentstream' AND table = '{table}' "
        "AND name != 'ingested_at' ORDER BY position",
    )
    return [name for (name,) in found]


def test_a_replay_reproduces_every_table_without_judge_calls_and_a_new_version_adds_its_own(
    broker, clickhouse_url, tmp_path
):
    ensure_topics(broker.bootstrap)
    rules_file = tmp_path / "judge-rules.yaml"
    rules_file.write_text("rules:\n  - name: all\n    mode: trajectory\n")
    rng = random.Random(17)
    with MessagesServer() as server:
        env = _env(server)
        live_args = worker_args(broker.bootstrap, tmp_path / "live", "scoring,judge")
        live = Proc(
            [*live_args, "--judge-rules", str(rules_file), "--grace-seconds", "120"],
            tmp_path / "live.log",
            env,
        )
        sink = start_sink(broker.bootstrap, clickhouse_url, tmp_path / "sink")
        client = reader(clickhouse_url)
        try:
            publish(
                broker.bootstrap,
                topics.AGENT_EVENTS,
                [e for i in range(TRAJECTORIES) for e in make_trajectory(f"rj{i}", STEPS, rng)],
            )
            wait_for(
                lambda: (
                    len({t["trajectory_id"] for t in _scored(broker.bootstrap) if t["complete"]})
                    == TRAJECTORIES
                ),
                timeout_s=180,
                interval_s=0.5,
                what=f"the live trajectories\n{live.log_text()[-3000:]}",
            )
            judge_calls = len(server.requests)
            assert judge_calls == TRAJECTORIES  # one call per trajectory, judged as a whole
            live_scored = _scored(broker.bootstrap)
            assert {t["reward_version"] for t in live_scored} == {"assembly-1+rules-1"}
            assert all("judge" in s["layers"] for t in live_scored for s in t["steps"])
            wait_for(lambda: group_caught_up(broker.bootstrap), timeout_s=60, what="the sink")
            wait_for(
                lambda: scalar(client, "SELECT count() FROM agentstream.trajectories FINAL") == TRAJECTORIES,
                what="the live trajectories in ClickHouse",
            )
            columns = {table: _columns(client, table) for table in ("events", "judge_scores")}
            before = snapshot(client)

            # 1. the same version, every role, from offset 0: the same rows, no judge call
            args = ("--judge-rules", str(rules_file), "--from-beginning")
            same = _replay(
                broker.bootstrap, tmp_path, env,
                "--roles", "scoring,judge", "--reward-version", "rules-1", *args,
            )  # fmt: skip
            assert "judge: " in same.stderr and "scoring: " in same.stderr and "lag 0" in same.stderr
            assert same.stderr.index("judge: ") < same.stderr.index("scoring: ")  # the judge first
            assert len(server.requests) == judge_calls  # every reply came from the live judge's cache
            again = _scored(broker.bootstrap)
            assert {t["event_id"] for t in again} == {t["event_id"] for t in live_scored}  # same ids
            assert len(again) > len(live_scored)  # ... published again by the replay's scoring
            wait_for(
                lambda: group_caught_up(broker.bootstrap), timeout_s=60, what="the sink after the replay"
            )
            after = snapshot(client)
            assert _comparable(after, columns) == _comparable(before, columns)
            assert (
                after["trajectories"] == before["trajectories"]
                and after["rule_rewards"] == before["rule_rewards"]
            )

            # 2. a new rule version: scoring alone (the judge's results are the live ones), beside the
            # live stack
            new = _replay(
                broker.bootstrap, tmp_path, env, "--roles", "scoring", "--reward-version", "rules-2",
                "--expect-judge", *args,
            )  # fmt: skip
            assert "scoring: " in new.stderr and "judge: 0/" not in new.stderr  # the judge not replayed
            scored = _scored(broker.bootstrap)
            v2 = {t["trajectory_id"]: t for t in scored if t["reward_version"] == "assembly-1+rules-2"}
            assert set(v2) == {f"rj{i}" for i in range(TRAJECTORIES)}
            assert all(
                t["complete"] and t["reward_definition"] == "rules+judge@assembly-1+rules-2"
                for t in v2.values()
            )
            live_now = [t for t in scored if t["reward_version"] == "assembly-1+rules-1"]
            assert {t["event_id"] for t in live_now} == {
                t["event_id"] for t in live_scored
            }  # nothing new live
            assert len(server.requests) == judge_calls
            wait_for(
                lambda: (
                    rows(
                        client,
                        "SELECT reward_version, count() FROM agentstream.rule_rewards FINAL "
                        "GROUP BY reward_version ORDER BY reward_version",
                    )
                    == [("rules-1", TRAJECTORIES * STEPS), ("rules-2", TRAJECTORIES * STEPS)]
                ),
                what="both rule versions in ClickHouse",
            )
            wait_for(lambda: group_caught_up(broker.bootstrap), timeout_s=60, what="the sink after rules-2")
            raw_versions = rows(
                client,
                "SELECT DISTINCT JSONExtractString(raw, 'reward_version') FROM agentstream.events FINAL "
                "WHERE type = 'trajectory.scored' ORDER BY 1",
            )
            assert raw_versions == [
                ("assembly-1+rules-1",),
                ("assembly-1+rules-2",),
            ]  # the raw log keeps both
            assert (
                scalar(client, "SELECT uniqExact(trajectory_id) FROM agentstream.trajectories FINAL")
                == TRAJECTORIES
            )
        finally:
            sink.proc.stop()
            live.stop()

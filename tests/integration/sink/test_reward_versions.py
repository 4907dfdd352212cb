"""Integration: the sink keeps a replay's trajectories beside the live ones and the replay's
`reward.version.completed` (published with `producers.reward_versions`) in `reward_versions`; from
then on the leaderboard shows the replay's version and says so."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime

from producers.reward_versions import completed_event, publish_completed
from schemas.events import EpisodeEnded, EpisodeStarted, TrajectoryScored
from tests.support.processes import AGENTSTREAM, wait_for
from tests.support.sink_harness import publish, reader, rows, scalar, start_sink

T0 = datetime(2026, 11, 21, 8, 0, tzinfo=UTC)
LIVE, REPLAY = "assembly-1+rules-1", "assembly-1+rules-2"


def _scored(tid: str, version: str, reward: float) -> TrajectoryScored:
    return TrajectoryScored(
        event_id=f"{tid}-{version}", trajectory_id=tid, occurred_at=T0, producer="assembler", task_id="k",
        domain="code", model="m", success=True, total_reward=reward, revision=1, reward_version=version,
    )  # fmt: skip


def _leaderboard(url: str, *extra: str) -> str:
    out = subprocess.run(
        [*AGENTSTREAM, "leaderboard", "--clickhouse-url", url, "--by", "model", *extra],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return out.stdout


def test_a_completed_replay_is_registered_and_becomes_what_the_leaderboard_shows(
    broker, clickhouse_url, tmp_path
):
    sink = start_sink(broker.bootstrap, clickhouse_url, tmp_path / "sink")
    try:
        episodes = [
            EpisodeStarted(event_id=f"{t}-s", trajectory_id=t, occurred_at=T0, producer="sdk", task_id="k",
                           domain="code", model="m") for t in ("a", "b")
        ] + [
            EpisodeEnded(event_id=f"{t}-e", trajectory_id=t, occurred_at=T0, producer="sdk", success=True)
            for t in ("a", "b")
        ]  # fmt: skip
        publish(broker.bootstrap, [*episodes, _scored("a", LIVE, 0.2), _scored("b", LIVE, 0.4)])
        client = reader(clickhouse_url)
        count = "SELECT count() FROM agentstream.trajectories FINAL"
        wait_for(lambda: scalar(client, count) == 2, 30, what="the live trajectories")
        assert _leaderboard(clickhouse_url).startswith(f"reward version: {LIVE} (newest complete: the live")

        publish(broker.bootstrap, [_scored("a", REPLAY, 0.9), _scored("b", REPLAY, 0.7)])
        started = datetime.now(UTC)
        event = completed_event("rules-2", ["rules", "assembler"], {("agent.events", 0): 4}, started)
        publish_completed(broker.bootstrap, event)
        publish_completed(broker.bootstrap, event)  # published twice: still one registry row
        registry = "SELECT version, roles, source_end_offsets FROM agentstream.reward_versions FINAL"
        wait_for(lambda: rows(client, registry), 30, what="the registry row")
        wait_for(lambda: scalar(client, count) == 4, 30, what="the replay's trajectories")
        assert rows(client, registry) == [("rules-2", ["assembler", "rules"], '{"agent.events":{"0":4}}')]
        both = "SELECT reward_version, avg(total_reward) FROM agentstream.trajectories FINAL GROUP BY 1"
        both += " ORDER BY 1"
        assert [(v, round(r, 6)) for v, r in rows(client, both)] == [(LIVE, 0.3), (REPLAY, 0.8)]
        client.close()
    finally:
        sink.proc.stop()
    table = _leaderboard(clickhouse_url)
    assert table.startswith(f"reward version: {REPLAY} (newest complete: replay of rules-2 completed ")
    board = json.loads(_leaderboard(clickhouse_url, "--format", "json"))
    assert [(r["mean_reward"], r["reward_version"]) for r in board] == [(0.8, REPLAY)]
    old = json.loads(_leaderboard(clickhouse_url, "--format", "json", "--reward-version", "rules-1"))
    assert [(round(r["mean_reward"], 6), r["reward_version"]) for r in old] == [(0.3, LIVE)]

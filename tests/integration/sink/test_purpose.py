"""Why an episode was run lands in ClickHouse (schema 1.5, migration 0014): `episodes.purpose` from the
start half of the episode (the end half leaves it alone), `trajectories.purpose` from the scored
trajectory; an episode recorded before 1.5 reads as NULL there (taken as train)."""

from __future__ import annotations

import pytest

from schemas.events import EpisodeEnded, EpisodeStarted, utc_now
from tests.support.processes import wait_for
from tests.support.sink_harness import publish, reader, rows, start_sink
from tests.support.trainer_data import golden_group

pytestmark = pytest.mark.integration


def test_purpose_lands_in_episodes_and_trajectories(broker, clickhouse_url, tmp_path):
    at = utc_now()
    events = []
    for tid, purpose in (("ep-eval", "eval"), ("ep-train", "train")):
        events += [
            EpisodeStarted(event_id=f"{tid}-s", trajectory_id=tid, occurred_at=at, producer="t", task_id="k",
                           purpose=purpose),
            EpisodeEnded(event_id=f"{tid}-e", trajectory_id=tid, occurred_at=at, producer="t", success=True),
        ]  # fmt: skip
    scored = golden_group()[0].model_copy(update={"purpose": "eval"})
    sink = start_sink(broker.bootstrap, clickhouse_url, tmp_path / "sink")
    try:
        publish(broker.bootstrap, [*events, scored])
        client = reader(clickhouse_url)
        query = (
            "SELECT trajectory_id, purpose, success FROM agentstream.episodes FINAL ORDER BY trajectory_id"
        )
        wait_for(lambda: len(rows(client, query)) == 2 and all(r[2] is not None for r in rows(client, query)),
                 timeout_s=60, what="both episodes, both halves")  # fmt: skip
        assert rows(client, query) == [("ep-eval", "eval", 1), ("ep-train", "train", 1)]
        traj = "SELECT purpose FROM agentstream.trajectories FINAL WHERE trajectory_id = "
        traj += f"'{scored.trajectory_id}'"
        wait_for(lambda: rows(client, traj), timeout_s=60, what="the scored trajectory")
        assert rows(client, traj) == [("eval",)]
        client.close()
    finally:
        sink.proc.stop()

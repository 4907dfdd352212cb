"""The registry row of a completed replay (`reward.version.completed` -> `reward_versions`) and the
event replay publishes (`producers.reward_versions.completed_event`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from consumers.sink.rows import COLUMNS, rows_for
from producers.reward_versions import completed_event
from schemas.codec import encode
from schemas.topics import REWARD_VERSIONS

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def test_one_replay_run_is_one_event_id():
    event = completed_event("rules-2", ["assembler", "rules", "rules"], {("agent.events", 1): 9}, T0, T0)
    assert event.roles == ["assembler", "rules"] and event.source_end_offsets == {"agent.events": {"1": 9}}
    assert event.trajectory_id == "reward-version:rules-2" and event.completed_at == event.occurred_at == T0
    again = completed_event("rules-2", ["rules"], {}, T0, T0 + timedelta(hours=1))
    assert again.event_id == event.event_id
    assert completed_event("rules-2", ["rules"], {}, T0 + timedelta(days=1)).event_id != event.event_id


def test_the_sink_row_of_the_registry():
    event = completed_event("rules-2", ["rules"], {("agent.events", 0): 3}, T0, T0, app_id="replay-x")
    _, (table, row) = rows_for(event, encode(event), REWARD_VERSIONS, 0, 4)
    assert table == "reward_versions"
    values = dict(zip(COLUMNS[table], row, strict=True))
    assert values["version"] == "rules-2" and values["source_end_offsets"] == '{"agent.events":{"0":3}}'
    assert values["completed_at"] == T0 and values["app_id"] == "replay-x" and values["since"] is None

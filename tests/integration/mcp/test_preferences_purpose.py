"""Evaluation never trains through MCP either (issue #38): `build_preferences` over ClickHouse offers
no pair with an evaluation episode (`trajectories.purpose = 'eval'`, migration 0014), even one that
would be the best of its task; given as JSON, a `trajectory.scored` of purpose eval is left out and
counted."""

from __future__ import annotations

import pytest

from clients.clickhouse.client import connect
from consumers.sink.rows import COLUMNS, rows_for
from infra.mcp.config import McpConfig
from infra.mcp.data_tools import build_preferences, sql
from infra.mcp.json_trajectory import rule_layer, score_json_trajectory
from schemas.codec import encode
from streams.rules.profiles import ProfileRegistry
from tests.support.db_serve import served_chdb

pytestmark = pytest.mark.integration

READ = {"tool": "read_file", "params": {"file_path": "src/app.py"}, "observation": "see src/util.py"}
EDIT = {"tool": "edit_file", "params": {"file_path": "src/util.py", "old_string": "a", "new_string": "b"}}
TEST = {"tool": "bash", "params": {"command": "pytest"}, "observation": "3 passed"}
PASSED = {"success": True, "tests_passed": 3, "tests_failed": 0}
FAILED = {"success": False, "tests_passed": 1, "tests_failed": 2}


def runs() -> list[tuple[dict, str]]:
    """One task's runs: the eval run is the cleanest (no re-read), so best_vs_worst would choose it."""
    base = {"task_id": "fix-util", "domain": "coding", "agent": "a", "model": "m", "reference_steps": 3}
    return [
        ({**base, "trajectory_id": "t-eval", "steps": [READ, EDIT, TEST], "outcome": PASSED}, "eval"),
        ({**base, "trajectory_id": "t-good", "steps": [READ, READ, EDIT, TEST], "outcome": PASSED}, "train"),
        ({**base, "trajectory_id": "t-bad", "steps": [READ, EDIT], "outcome": FAILED}, "train"),
    ]


def scored_events() -> list:
    return [score_json_trajectory(data).model_copy(update={"purpose": purpose}) for data, purpose in runs()]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mcp-purpose")
    with served_chdb(tmp, 20) as url:
        events = []
        for data, _ in runs():
            steps, rewards = rule_layer(data, ProfileRegistry())
            events += [*steps, *rewards]
        by_table: dict[str, list] = {}
        for offset, event in enumerate([*events, *scored_events()]):
            for table, row in rows_for(event, encode(event), "tests", 0, offset):
                by_table.setdefault(table, []).append(row)
        client = connect(url, wait_s=10, role="writer")
        try:
            for table, rows in by_table.items():
                client.insert(f"agentstream.{table}", rows, column_names=list(COLUMNS[table]))
        finally:
            client.close()
        yield McpConfig(clickhouse_url=url, sql_max_rows=50, sql_timeout_s=20)


def pair_ids(result: dict) -> list[tuple[str, str]]:
    return [(p["chosen_trajectory_id"], p["rejected_trajectory_id"]) for p in result["pairs"]]


def test_an_eval_trajectory_in_clickhouse_is_never_offered(store):
    stored = sql(store, "SELECT trajectory_id, purpose FROM trajectories FINAL ORDER BY trajectory_id")
    assert [(r["trajectory_id"], r["purpose"]) for r in stored["rows"]] == [
        ("t-bad", "train"), ("t-eval", "eval"), ("t-good", "train"),
    ]  # fmt: skip
    for task_id in ("fix-util", None):
        result = build_preferences(store, task_id=task_id, strategy="all_pairs")
        assert pair_ids(result) == [("t-good", "t-bad")], result
        assert result["trajectories"] == 2
    # the store leaves eval out before the limit (by id t-bad, t-eval, t-good: else t-eval took a place)
    assert pair_ids(build_preferences(store, task_id="fix-util", limit=2)) == [("t-good", "t-bad")]
    steps = build_preferences(store, task_id="fix-util", level="step")
    assert all("t-eval" not in pair for pair in pair_ids(steps)) and steps["trajectories"] == 2


def test_an_eval_trajectory_given_as_json_is_left_out_and_counted():
    events = [e.model_dump(mode="json") for e in scored_events()]
    with_eval = build_preferences(McpConfig(), events)
    assert pair_ids(with_eval) == [("t-good", "t-bad")]
    assert with_eval["trajectories"] == 2 and with_eval["left_out_by_purpose"] == 1
    as_train = [{**e, "purpose": "train"} for e in events]  # the same runs for training: eval's wins
    assert pair_ids(build_preferences(McpConfig(), as_train)) == [("t-eval", "t-bad")]

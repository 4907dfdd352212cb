"""policy.updated -> one `policy_versions` row (lineage, metrics as a map and headline columns),
besides its `policy_updates` row; and the lineage report's pure parts."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from consumers.sink.rows import COLUMNS, rows_for
from infra.lineage import format_lineage, steps_per_version, version_sql
from schemas.codec import encode
from schemas.events import PolicyUpdated

UPDATE = PolicyUpdated(
    event_id="pu", trajectory_id="v3", occurred_at=datetime(2026, 11, 1, tzinfo=UTC), producer="x",
    policy_version="v3", previous_version="v2", method="grpo", step=12, base_model="tiny",
    checkpoint_path="/c/v3", batch_ids=["b1", "b2"], metrics={"loss": 0.25, "ess": 0.8, "tokens": 900.0},
    source_ranges={"trajectory.scored": {"0": [10, 19], "1": [3, 7]}}, trajectory_ids=["t1"],
    behaviour_versions=["v1", "v2"], staleness_histogram={"0": 3, "1": 2}, dropped_groups=4,
    base_model_id="0123abcd0123abcd", tokenizer_hash="feedfacefeedface",
)  # fmt: skip


def _tables(event) -> dict[str, dict]:
    return {
        t: dict(zip(COLUMNS[t], row, strict=True)) for t, row in rows_for(event, encode(event), "p", 0, 5)
    }


def test_policy_updated_gives_a_policy_versions_row_with_its_lineage():
    tables = _tables(UPDATE)
    assert set(tables) == {"events", "policy_updates", "policy_versions"}
    row = tables["policy_versions"]
    assert (row["policy_version"], row["previous_version"], row["method"], row["step"]) == (
        "v3",
        "v2",
        "grpo",
        12,
    )
    assert row["batch_ids"] == ["b1", "b2"] and row["behaviour_versions"] == ["v1", "v2"]
    assert json.loads(row["source_ranges"]) == {"trajectory.scored": {"0": [10, 19], "1": [3, 7]}}
    assert row["staleness_histogram"] == {"0": 3, "1": 2} and row["dropped_groups"] == 4
    assert row["metrics"]["tokens"] == 900.0 and (row["loss"], row["ess"]) == (0.25, 0.8)
    assert row["kl"] is None and row["is_ratio_mean"] is None  # absent, never a made-up 0
    assert (row["base_model_id"], row["tokenizer_hash"]) == ("0123abcd0123abcd", "feedfacefeedface")


def test_lineage_report_counts_steps_per_producing_version_and_binds_input():
    sql = version_sql("v3' OR 1")
    assert "v3' OR 1" not in sql.text and sql.params == {"v": "v3' OR 1"}
    steps = [
        {"event_id": f"e{i}", "trajectory_id": "t1", "step_index": i, "policy_version": "v1" if i else None}
        for i in range(4)
    ]
    assert steps_per_version(steps) == {"": 1, "v1": 3}
    version = {**_tables(UPDATE)["policy_versions"], "source_ranges": UPDATE.source_ranges}
    text = format_lineage(
        {"version": version, "batches": [], "trajectories": [{}], "steps": steps,
         "steps_by_policy_version": steps_per_version(steps)},
        limit=2,
    )  # fmt: skip
    assert text.startswith("v3 <- parent v2: grpo step 12")
    assert "b2: (no batch.built row)" in text and "dropped groups: 4" in text
    assert "e1" in text and "e2" not in text and "2 more" in text

"""policy.updated's `rows_over_max_length` metric fills its `policy_versions` column (0 when absent);
a value that is no count is refused (the sink dead-letters the record), never stored as something."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from consumers.sink.rows import COLUMNS, rows_for
from schemas.codec import encode
from schemas.events import PolicyUpdated


def _update(**metrics) -> PolicyUpdated:
    return PolicyUpdated(
        event_id="pu", trajectory_id="v1", occurred_at=datetime(2026, 11, 1, tzinfo=UTC), producer="x",
        policy_version="v1", method="sft", metrics={"loss": 0.5, **metrics},
    )  # fmt: skip


def _column(event) -> int:
    [row] = [r for t, r in rows_for(event, encode(event), "p", 0, 1) if t == "policy_versions"]
    return dict(zip(COLUMNS["policy_versions"], row, strict=True))["rows_over_max_length"]


def test_the_count_fills_the_column_and_absent_is_zero():
    assert _column(_update(rows_over_max_length=3.0, tokens_over_max_length=2100.0)) == 3
    assert _column(_update()) == 0  # before 1.5, or no row over


@pytest.mark.parametrize("bad", [-1.0, 2.5, 2.0**32])  # inf: the schema refuses it already
def test_a_value_that_is_no_count_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match=rf"metrics.rows_over_max_length: .*{bad!r}"):
        _column(_update(rows_over_max_length=bad))

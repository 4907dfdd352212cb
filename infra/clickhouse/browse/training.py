"""The training page: batches by kind over time, the latest batches, policy versions and the
learning curve (`agentstream.policy_version_stats`).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from clients.clickhouse import DATABASE as DB
from infra.clickhouse.sql import Sql, run, run_dicts

BATCH_SPAN_SQL = Sql(f"SELECT min(occurred_at), max(occurred_at), count() FROM {DB}.batches")


def batches_over_time_sql(bucket_s: int) -> Sql:
    return Sql(
        "SELECT toStartOfInterval(occurred_at, toIntervalSecond({bucket:UInt32})) AS t, kind, "
        f"count() AS batches, sum(row_count) AS rows FROM {DB}.batches FINAL GROUP BY t, kind ORDER BY t",
        {"bucket": bucket_s},
    )


RECENT_BATCHES_SQL = Sql(
    "SELECT batch_id, occurred_at, kind, row_count, length(trajectory_ids) AS trajectories, "
    f"reward_versions, policy_versions FROM {DB}.batches FINAL ORDER BY occurred_at DESC LIMIT 20"
)
POLICY_VERSIONS_SQL = Sql(
    "SELECT policy_version, previous_version, occurred_at, method, step, length(batch_ids) AS batches, "
    "length(trajectory_ids) AS trajectories, loss, kl, ess, clipped_fraction, metrics "
    f"FROM {DB}.policy_versions FINAL ORDER BY occurred_at"
)
LEARNING_CURVE_SQL = Sql(
    "SELECT policy_version, episodes, judged, success_rate, mean_total_reward, first_seen "
    f"FROM {DB}.policy_version_stats ORDER BY first_seen"
)


def bucket_seconds(first: datetime | None, last: datetime | None, buckets: int = 40) -> int:
    """A bucket width that cuts the span into about `buckets` pieces (at least a second).

    >>> bucket_seconds(datetime(2026, 1, 1), datetime(2026, 1, 1, 1))
    90
    """
    if first is None or last is None:
        return 60
    return max(1, math.ceil((last - first).total_seconds() / buckets))


def training_page(client) -> dict[str, Any]:
    """Batches by kind over time, the latest batches, policy versions and the learning curve."""
    first, last, count = run(client, BATCH_SPAN_SQL)[0]
    bucket = bucket_seconds(first, last) if count else 60
    return {
        "bucket_s": bucket,
        "batches_over_time": run_dicts(client, batches_over_time_sql(bucket)) if count else [],
        "recent_batches": run_dicts(client, RECENT_BATCHES_SQL),
        "versions": run_dicts(client, POLICY_VERSIONS_SQL),
        "learning_curve": run_dicts(client, LEARNING_CURVE_SQL),
    }

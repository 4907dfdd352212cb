"""The overview's figures and the leaderboard's extras: row counts per table, the latest dead
letters, and the mean rule and judge score by step index.
"""

from __future__ import annotations

from clients.clickhouse import DATABASE as DB
from infra.clickhouse.sql import Sql


def dead_letters_sql(limit: int = 20) -> Sql:
    return Sql(
        "SELECT occurred_at, stage, reason, error_type, source_topic, source_partition, source_offset, "
        f"source_key, trajectory_id, event_id FROM {DB}.dead_letters FINAL "
        "ORDER BY occurred_at DESC, event_id LIMIT {limit:UInt32}",
        {"limit": limit},
    )


COUNTS_SQL = Sql(
    f"SELECT (SELECT count() FROM {DB}.events) AS events, (SELECT count() FROM {DB}.steps) AS steps, "
    f"(SELECT uniqExact(trajectory_id) FROM {DB}.trajectories) AS trajectories, "
    f"(SELECT count() FROM {DB}.dead_letters) AS dead_letters, (SELECT count() FROM {DB}.batches) AS batches"
)


def reward_by_step_sql(domain: str | None = None) -> Sql:
    """Mean rule and judge score by step index, per domain (`agentstream.reward_by_step`)."""
    where = " WHERE domain = {domain:String}" if domain else ""
    return Sql(
        "SELECT domain, step_index, steps, mean_rule_score, mean_judge_score "
        f"FROM {DB}.reward_by_step{where} ORDER BY domain, step_index",
        {"domain": domain} if domain else {},
    )

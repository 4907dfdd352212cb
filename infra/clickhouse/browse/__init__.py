"""The queries behind browsing what ClickHouse knows. The web console (`infra.console`), MCP and the
CLI (`agentstream trajectory`, `trajectories`) run these same builders; there is no second copy of
the SQL. Every value that comes from a user is bound as a ClickHouse parameter
(`infra.clickhouse.sql.Sql`); the functions that run queries take a clickhouse-connect client and
return plain dicts.

- filters.py: `TrajectoryFilter` and `parse_filter` (a malformed value raises `FilterError`);
- trajectory_list.py: one page of the list, its count and facets;
- trajectory_detail.py: one trajectory with every layer (scores, texts, verdicts, annotations);
- overview.py: row counts, dead letters, reward by step;
- training.py: batches, policy versions and the learning curve.
"""

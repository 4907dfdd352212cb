"""The query layer over ClickHouse: parameter-bound SQL (sql.py), the analytics and leaderboard
(analytics.py), the trajectory list and detail (browse/) and the reward version shown
(versions.py). The console, MCP, export and the commands read through it; it never prints and
imports no command (the `db`, `sql`, `leaderboard` and `trajectory` commands are in
infra/commands/clickhouse.py). Connections and migrations live below, in `clients.clickhouse`."""

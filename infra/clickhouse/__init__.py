"""ClickHouse for the top floor: the `db`, `sql`, `leaderboard` and `trajectory` commands and the
analytics queries behind them. Connections and migrations live below, in `clients.clickhouse`."""

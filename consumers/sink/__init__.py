"""The ClickHouse sink: every topic into ClickHouse. `rows` (pure event -> row mapping), `base` (the
sink contract), `clickhouse` (batched inserts with retries and per-row refusal), `runner` (the
kafka-python consumer group, dead letters, commit after the write; `SinkConfig`)."""

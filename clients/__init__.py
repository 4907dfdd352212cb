"""The ground floor: how every part of agentstream talks to Kafka and to ClickHouse.

- `clients.kafka`: one producer / consumer factory with one set of limits, topic creation from the
  registry, read-to-end; its parts read a topic range or follow a topic (`ranges`), run the
  consume -> handle -> write -> dead-letter -> commit loop (`consume`, `dead_letters`) and send
  record batches (`record_batches`).
- `clients.clickhouse`: a client from a URL (chDB embedded or a server), the chDB HTTP endpoint,
  versioned migrations.

Imports only `schemas`; everything above (producers, streams, consumers, infra) imports it.
"""

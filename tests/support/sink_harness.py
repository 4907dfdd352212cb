"""Helpers for the sink integration tests: a real `agentstream sink` process, readers that never
open chDB inside the test process (they go through the sink's HTTP endpoint), and Kafka helpers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clients.clickhouse.client import chdb_path, connect, live_endpoint
from schemas.codec import encode, encode_key
from schemas.topics import TOPICS, topic_for
from tests.support.processes import AGENTSTREAM, Proc, wait_for

TABLE_KEYS = {
    "events": "event_id",
    "episodes": "trajectory_id",
    "steps": "event_id",
    "rule_rewards": "event_id",
    "judge_scores": "event_id",
    "annotations": "event_id",
    "trajectories": "trajectory_id",
    "batches": "event_id",
    "policy_updates": "event_id",
    "dead_letters": "event_id",
}


@dataclass
class SinkProc:
    proc: Proc
    ready_url: str


def start_sink(bootstrap: str, url: str, workdir: Path, *extra: str, name: str = "sink") -> SinkProc:
    workdir.mkdir(parents=True, exist_ok=True)
    ready = workdir / f"{name}.ready"
    ready.unlink(missing_ok=True)
    args = [*AGENTSTREAM, "sink", "--bootstrap-servers", bootstrap, "--clickhouse-url", url]
    args += ["--ready-file", str(ready), "--flush-interval-s", "0.2", *extra]
    proc = Proc(args, workdir / f"{name}.log")

    def is_ready():
        if not proc.alive():
            raise RuntimeError(f"sink exited with {proc.popen.returncode}:\n{proc.log_text()[-4000:]}")
        return ready.exists() and ready.read_text()

    return SinkProc(proc, wait_for(is_ready, timeout_s=90, what="the sink to consume"))


def reader(url: str):
    """A client for `url` that reads through the serving process for an embedded path."""
    path = chdb_path(url)
    if path is not None:
        served = wait_for(lambda: live_endpoint(path), timeout_s=30, what="the chDB HTTP endpoint")
        import clickhouse_connect

        return clickhouse_connect.get_client(dsn=served)
    return connect(url)


def rows(client, sql: str) -> list[tuple]:
    return list(client.query(sql).result_rows)


def scalar(client, sql: str):
    return rows(client, sql)[0][0]


def publish(bootstrap: str, events, raw: list[tuple[str, bytes, bytes]] = ()) -> None:
    """Publish events (to their registry topic, keyed by trajectory) and raw (topic, key, value) records."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        for event in events:
            producer.send(topic_for(event.type), key=encode_key(event), value=encode(event))
        for topic, key, value in raw:
            producer.send(topic, key=key, value=value)
        producer.flush()
    finally:
        producer.close()


def group_caught_up(bootstrap: str, group: str = "agentstream-sink") -> bool:
    """True when the group's committed offsets reach the end of every registry partition."""
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        committed = admin.list_group_offsets(group).get(group, {})
        parts = [TopicPartition(t, p) for t in TOPICS for p in sorted(consumer.partitions_for_topic(t) or ())]
        ends = consumer.end_offsets(parts)
    finally:
        admin.close()
        consumer.close()
    return all(ends[tp] == 0 or (tp in committed and committed[tp].offset >= ends[tp]) for tp in parts)


def snapshot(client) -> dict[str, list[tuple]]:
    """Every table's deduplicated content (FINAL), minus the ingestion timestamp, in a fixed order."""
    out = {}
    for table, key in TABLE_KEYS.items():
        columns = [
            c
            for (c,) in rows(
                client,
                f"SELECT name FROM system.columns WHERE database = 'agentstream' "
                f"AND table = '{table}' AND name != 'ingested_at' ORDER BY position",
            )
        ]
        listed = ", ".join(f"toString({c})" for c in columns)
        out[table] = rows(client, f"SELECT {listed} FROM agentstream.{table} FINAL ORDER BY {key}, {listed}")
    return out


def group_members(bootstrap: str, group: str = "agentstream-sink") -> int:
    """How many members the consumer group has now (0 once a killed member's session expired)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = admin.describe_groups([group]).get(group, {})
    finally:
        admin.close()
    return len(described.get("members") or [])

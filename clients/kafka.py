"""How every part of agentstream talks to Kafka: one producer / consumer factory with one set of
limits, topic creation from the registry, and read-to-end.

Works against the embedded broker and Apache Kafka alike (only the bootstrap address differs).
kafka-python and aiokafka are imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from schemas.records import Record
from schemas.topics import TOPICS, TopicSpec

log = logging.getLogger(__name__)

# One set of limits for every producer: acknowledged means written to the log (acks=all); a record
# up to 16 MiB (a step with a large observation) is accepted; batches of up to 256 KiB per partition.
MAX_REQUEST_BYTES = 16 * 1024 * 1024
BATCH_BYTES = 256 * 1024
PRODUCER_DEFAULTS: dict[str, Any] = {
    "acks": "all",
    "linger_ms": 5,
    "batch_size": BATCH_BYTES,
    "max_request_size": MAX_REQUEST_BYTES,
}


def make_producer(bootstrap_servers: str, client_id: str, **overrides: Any):
    """A kafka-python `KafkaProducer` with the project's limits; `overrides` for what a caller must
    change (timeouts, linger)."""
    from kafka import KafkaProducer

    options = {**PRODUCER_DEFAULTS, "reconnect_backoff_max_ms": 1000, **overrides}
    return KafkaProducer(bootstrap_servers=bootstrap_servers, client_id=client_id, **options)


def make_async_producer(bootstrap_servers: str, client_id: str, **overrides: Any):
    """An aiokafka `AIOKafkaProducer` with the same limits (not started)."""
    from aiokafka import AIOKafkaProducer

    options = {**PRODUCER_DEFAULTS, "max_batch_size": BATCH_BYTES, **overrides}
    options.pop("batch_size", None)
    return AIOKafkaProducer(bootstrap_servers=bootstrap_servers, client_id=client_id, **options)


def make_consumer(bootstrap_servers: str, client_id: str, group_id: str | None = None, **overrides: Any):
    """A kafka-python `KafkaConsumer` that commits only when told to, reading from the earliest
    offset when its group has none."""
    from kafka import KafkaConsumer

    options = {"enable_auto_commit": False, "auto_offset_reset": "earliest", **overrides}
    return KafkaConsumer(
        bootstrap_servers=bootstrap_servers, client_id=client_id, group_id=group_id, **options
    )


def read_to_end(bootstrap_servers: str, topics: Iterable[str], timeout_s: float = 30.0) -> list[Record]:
    """Every record on `topics` from the beginning up to their end offsets at call time (no group,
    nothing committed). Stops after `timeout_s` with what it read, and says so in the log."""
    from kafka import TopicPartition

    consumer = make_consumer(bootstrap_servers, "agentstream-reader")
    try:
        parts = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        if not parts:
            return []
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        end = consumer.end_offsets(parts)
        records: list[Record] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in parts):
            if time.monotonic() > deadline:
                log.warning("read_to_end: stopped after %.0fs with %d records", timeout_s, len(records))
                break
            for tp, batch in consumer.poll(timeout_ms=200).items():
                records += [
                    Record(tp.topic, tp.partition, m.offset, m.key, m.value, m.timestamp)
                    for m in batch
                    if m.offset < end[tp]
                ]
        return records
    finally:
        consumer.close()


def ensure_topics(
    bootstrap_servers: str, specs: Iterable[TopicSpec] | None = None, *, timeout_s: float = 30.0
) -> list[str]:
    """Create every registry topic that does not exist yet (idempotent); returns the names created."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    specs = list(TOPICS.values() if specs is None else specs)
    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap_servers,
        client_id="agentstream-admin",
        request_timeout_ms=int(timeout_s * 1000),
    )
    try:
        existing = set(admin.list_topics())
        created = []
        for spec in (s for s in specs if s.name not in existing):
            topic = NewTopic(spec.name, spec.partitions, 1, topic_configs=dict(spec.config))
            try:
                admin.create_topics([topic])
                created.append(spec.name)
            except TopicAlreadyExistsError:
                pass  # another process won the race; that is fine
        if created:
            log.info("created topics: %s", ", ".join(created))
        return created
    finally:
        admin.close()

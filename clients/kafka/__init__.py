"""How every part of agentstream talks to Kafka: one producer / consumer / admin factory with one
set of limits, topic creation from the registry, read-to-end, and the broker reachability probe.

The parts (none of them creates a client; they take one from this factory):
- `clients.kafka.ranges`: read a topic range to its end; follow a topic.
- `clients.kafka.consume`: the consume -> handle -> write -> dead-letter -> commit loop.
- `clients.kafka.dead_letters`: a refused record as a `dead.letter` with its source coordinates.
- `clients.kafka.poison`: poison (dead-letter the record) or outage (exit, read it again).
- `clients.kafka.groups`: commit a consumer group's offsets from outside it (rewind, skip, replay).
- `clients.kafka.record_batches`: send messages as one record batch per partition (aiokafka).

Works against the embedded broker and Apache Kafka alike (only the bootstrap address differs).
kafka-python and aiokafka are imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import logging
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


def make_producer(bootstrap_servers: str, client_id: str, *, project_limits: bool = True, **overrides: Any):
    """A kafka-python `KafkaProducer` with the project's limits; `overrides` for what a caller must
    change (timeouts, linger). `project_limits=False`: the library's own defaults plus `overrides`
    (a benchmark of the broker that must not move with the project's settings)."""
    from kafka import KafkaProducer

    limits = {**PRODUCER_DEFAULTS, "reconnect_backoff_max_ms": 1000} if project_limits else {}
    options = {**limits, **overrides}
    return KafkaProducer(bootstrap_servers=bootstrap_servers, client_id=client_id, **options)


def make_async_producer(
    bootstrap_servers: str, client_id: str, *, project_limits: bool = True, **overrides: Any
):
    """An aiokafka `AIOKafkaProducer` with the same limits (not started); `project_limits` as in
    `make_producer`."""
    from aiokafka import AIOKafkaProducer

    limits = {**PRODUCER_DEFAULTS, "max_batch_size": BATCH_BYTES} if project_limits else {}
    options = {**limits, **overrides}
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


def make_async_consumer(
    bootstrap_servers: str, client_id: str, group_id: str | None = None, **overrides: Any
):
    """An aiokafka `AIOKafkaConsumer` (not started) with `make_consumer`'s defaults: commits only
    when told to, from the earliest offset when its group has none."""
    from aiokafka import AIOKafkaConsumer

    options = {"enable_auto_commit": False, "auto_offset_reset": "earliest", **overrides}
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers, client_id=client_id, group_id=group_id, **options
    )


def make_admin(bootstrap_servers: str, client_id: str, **overrides: Any):
    """A kafka-python `KafkaAdminClient` (topics, consumer groups, committed offsets); `overrides`
    for what a caller must change (a short `request_timeout_ms` to probe a broker). It connects when
    built: an unreachable cluster raises a kafka-python `KafkaError` here. The caller closes it."""
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=bootstrap_servers, client_id=client_id, **overrides)


async def broker_reachable(bootstrap_servers: str, timeout_s: float = 2.0) -> bool:
    """Whether any bootstrap address answers a Kafka ApiVersions request within `timeout_s` (a
    health probe: any failure to answer is False, never raised)."""
    import asyncio

    from aiokafka.client import AIOKafkaClient

    client = AIOKafkaClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=int(timeout_s * 1000))
    try:
        await asyncio.wait_for(client.bootstrap(), timeout_s)
        return True
    except Exception:
        return False
    finally:
        await client.close()


def read_to_end(
    bootstrap_servers: str, topics: Iterable[str], timeout_s: float = 30.0, *, strict: bool = False
) -> list[Record]:
    """Every record on `topics` from the beginning up to their end offsets at call time (no group,
    nothing committed). After `timeout_s` it stops with what it read and says so in the log, or,
    when `strict`, raises `clients.kafka.ranges.ReadIncomplete`."""
    from clients.kafka.ranges import iter_range, topic_partitions

    consumer = make_consumer(bootstrap_servers, "agentstream-reader")
    try:
        parts = topic_partitions(consumer, topics)
        return list(iter_range(consumer, parts, timeout_s=timeout_s, strict=strict))
    finally:
        consumer.close()


def ensure_topics(
    bootstrap_servers: str, specs: Iterable[TopicSpec] | None = None, *, timeout_s: float = 30.0
) -> list[str]:
    """Create every registry topic that does not exist yet (idempotent); returns the names created."""
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    specs = list(TOPICS.values() if specs is None else specs)
    admin = make_admin(bootstrap_servers, "agentstream-admin", request_timeout_ms=int(timeout_s * 1000))
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

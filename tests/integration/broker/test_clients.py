"""The embedded broker serves unmodified kafka-python and aiokafka clients over TCP (issue 3).

Covers: a kafka-python producer and group consumer; two consumers splitting a topic's partitions
and one taking everything over when the other leaves; committed offsets surviving a restart; an
aiokafka producer and group consumer; transactional producers refused with a clear error; the
admin paths (DescribeConfigs with defaults, duplicate CreateTopics).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from tests.support.processes import wait_for

pytestmark = pytest.mark.integration

FAST_GROUP = {"heartbeat_interval_ms": 300, "session_timeout_ms": 6000}


def create_topic(bootstrap: str, name: str, partitions: int, configs: dict | None = None) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs or {})])
    finally:
        admin.close()


def produce(bootstrap: str, topic: str, values: list[bytes], **kwargs) -> list:
    producer = KafkaProducer(bootstrap_servers=bootstrap, **kwargs)
    try:
        futures = [producer.send(topic, key=v, value=v) for v in values]
        producer.flush()
        return [f.get(timeout=10) for f in futures]
    finally:
        producer.close()


def consume(consumer: KafkaConsumer, count: int, timeout_s: float = 20.0) -> list:
    records, deadline = [], time.monotonic() + timeout_s
    while len(records) < count and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=200).values():
            records.extend(batch)
    return records


def test_kafka_python_group_consumer_and_offsets_survive_restart(broker):
    create_topic(broker.bootstrap, "orders", 2)
    first = [b"order-%d" % i for i in range(40)]
    metadata = produce(broker.bootstrap, "orders", first)
    assert sorted(m.partition for m in metadata) != [0] * 40, "keys spread over both partitions"

    group = {
        "group_id": "billing",
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        **FAST_GROUP,
    }
    consumer = KafkaConsumer("orders", bootstrap_servers=broker.bootstrap, **group)
    records = consume(consumer, 40)
    consumer.commit()
    consumer.close()
    assert sorted(r.value for r in records) == sorted(first)

    broker.restart()
    assert "storage flushed and closed" in broker.proc.log_text(), "SIGTERM shuts down cleanly"
    later = [b"late-%d" % i for i in range(10)]
    produce(broker.bootstrap, "orders", later)
    consumer = KafkaConsumer("orders", bootstrap_servers=broker.bootstrap, **group)
    try:
        records = consume(consumer, 10)
        time.sleep(0.5)  # anything re-delivered from before the restart would show up here
        records += consume(consumer, 1, timeout_s=0.5)
        committed = {p: consumer.committed(TopicPartition("orders", p)) for p in (0, 1)}
    finally:
        consumer.close()
    assert sorted(r.value for r in records) == sorted(later), "resumed from the committed offsets"
    assert sum(committed.values()) == 40


class PollingConsumer(threading.Thread):
    """A kafka-python group consumer polling in its own thread, recording what it receives."""

    def __init__(self, bootstrap: str, topic: str, group: str):
        super().__init__(daemon=True)
        self.consumer = KafkaConsumer(
            topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest", **FAST_GROUP
        )
        self.values: list[bytes] = []
        self.assigned: set[int] = set()
        self.running = True

    def run(self) -> None:
        while self.running:
            for batch in self.consumer.poll(timeout_ms=100).values():
                self.values.extend(r.value for r in batch)
            self.assigned = {tp.partition for tp in self.consumer.assignment()}
        self.consumer.close()

    def stop(self) -> None:
        self.running = False
        self.join(timeout=20)


def test_two_consumers_split_partitions_and_survivor_takes_over(broker):
    create_topic(broker.bootstrap, "jobs", 4)
    one = PollingConsumer(broker.bootstrap, "jobs", "workers")
    two = PollingConsumer(broker.bootstrap, "jobs", "workers")
    one.start()
    two.start()
    try:
        wait_for(lambda: len(one.assigned) == 2 and len(two.assigned) == 2, 30, what="a 2+2 split")
        assert one.assigned.isdisjoint(two.assigned)
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        try:
            described = admin.describe_groups(["workers"])["workers"]
            listed = admin.list_groups()
        finally:
            admin.close()
        assert described["group_state"] == "Stable" and len(described["members"]) == 2
        assert {"group_id": "workers", "protocol_type": "consumer", "group_state": "Stable"} in listed
        two.stop()
        wait_for(lambda: one.assigned == {0, 1, 2, 3}, 30, what="the survivor to own all partitions")
        values = [b"job-%d" % i for i in range(40)]
        metadata = produce(broker.bootstrap, "jobs", values)
        assert {m.partition for m in metadata} == {0, 1, 2, 3}
        wait_for(lambda: set(values) <= set(one.values), 20, what="the survivor to consume every job")
    finally:
        one.stop()
        two.stop()


def test_aiokafka_producer_and_group_consumer(shared_broker):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    bootstrap = shared_broker.bootstrap
    create_topic(bootstrap, "aio-events", 3)
    values = [b"event-%d" % i for i in range(300)]

    async def scenario() -> tuple[list[bytes], int]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for v in values:
                await producer.send("aio-events", v, key=v)
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            "aio-events", bootstrap_servers=bootstrap, group_id="aio-group", auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            got: list[bytes] = []
            deadline = time.monotonic() + 20
            while len(got) < len(values) and time.monotonic() < deadline:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    got.extend(r.value for r in batch)
            await consumer.commit()
            committed = 0
            for tp in consumer.assignment():
                committed += await consumer.committed(tp) or 0
        finally:
            await consumer.stop()
        return got, committed

    got, committed = asyncio.run(scenario())
    assert sorted(got) == sorted(values)
    assert committed == len(values)


def test_transactional_producers_get_a_clear_error(shared_broker):
    producer = KafkaProducer(bootstrap_servers=shared_broker.bootstrap, transactional_id="tx-1")
    try:
        with pytest.raises(KafkaError, match="TransactionalIdAuthorizationFailed"):
            producer.init_transactions()
    finally:
        producer.close(timeout=1)

    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError as AioKafkaError

    async def start_transactional() -> None:
        aio = AIOKafkaProducer(bootstrap_servers=shared_broker.bootstrap, transactional_id="tx-2")
        try:
            await aio.start()
        finally:
            await aio.stop()

    with pytest.raises(AioKafkaError, match="TransactionalIdAuthorizationFailed"):
        asyncio.run(start_transactional())


def test_admin_describe_configs_and_duplicate_create(shared_broker):
    bootstrap = shared_broker.bootstrap
    create_topic(bootstrap, "configured", 1, {"retention.ms": "12345", "cleanup.policy": "compact"})
    with pytest.raises(TopicAlreadyExistsError):
        create_topic(bootstrap, "configured", 1)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        resource = ConfigResource(ConfigResourceType.TOPIC, "configured")
        every = admin.describe_configs([resource], config_filter="all")["topic"]["configured"]
        modified = admin.describe_configs([resource])["topic"]["configured"]
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    assert every["retention.ms"]["value"] == "12345"
    assert every["cleanup.policy"]["value"] == "compact"
    assert every["segment.bytes"]["value"], "defaults are included, not only overrides"
    assert "retention.bytes" in every
    assert set(modified) == {"retention.ms", "cleanup.policy"}, "defaults are reported as defaults"
    node = cluster["brokers"][0]
    assert cluster["controller_id"] == node["broker_id"], "faust sends CreateTopics to the controller"
    assert f"{node['host']}:{node['port']}" == bootstrap

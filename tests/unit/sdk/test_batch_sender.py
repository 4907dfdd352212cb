"""The SDK's batch sender: records land in the partition every Kafka client picks for their key,
grouped into as few record batches as the batch size allows, in order."""

from __future__ import annotations

import uuid

from kafka.partitioner.default import murmur2

from producers import batch_sender
from producers.batch_sender import _cache_partition, _fill, _partition_for
from producers.spool import SpoolRecord


def test_a_key_gets_the_partition_kafka_pythons_default_partitioner_gives_it():
    partitions = [0, 1, 2, 3, 4, 5]
    for _ in range(500):
        key = str(uuid.uuid4()).encode()
        assert _partition_for(key, partitions) == partitions[(murmur2(key) & 0x7FFFFFFF) % len(partitions)]


class _Producer:
    """What `_fill` uses of aiokafka's producer: `create_batch` (the real batch builder)."""

    def create_batch(self):
        from aiokafka.producer.message_accumulator import BatchBuilder

        return BatchBuilder(16 * 1024, 0)


def test_records_fill_as_few_batches_as_fit_and_keep_their_order():
    records = [SpoolRecord("agent.events", b"t", f"e{i}", b"v" * 3000, i) for i in range(12)]
    batches = _fill(_Producer(), "agent.events", 3, records)
    assert len(batches) == 3  # 5 records of ~3 KB fit in 16 KiB
    assert [r for b in batches for r in b.records] == records
    assert all(b.topic == "agent.events" and b.partition == 3 for b in batches)
    assert [b.builder.record_count() for b in batches] == [len(b.records) for b in batches]


def test_the_partition_cache_stays_bounded(monkeypatch):
    monkeypatch.setattr(batch_sender, "_KEYS_CACHED", 3)
    by_key: dict[bytes, int] = {}
    for i in range(10):
        key = f"t{i}".encode()
        assert _cache_partition(by_key, key, [0, 1]) == _partition_for(key, [0, 1])
        assert len(by_key) <= 3 and by_key[key] == _partition_for(key, [0, 1])


def test_a_chunk_of_2kb_steps_goes_in_batches_of_up_to_a_megabyte_that_any_broker_takes():
    from aiokafka.producer.message_accumulator import BatchBuilder

    from infra.broker.log_config import LogConfig

    kafka_default_max_message_bytes = 1_048_588
    broker_limit = min(kafka_default_max_message_bytes, LogConfig().max_message_bytes)
    assert broker_limit > batch_sender.BATCH_BYTES

    class _Large:
        def create_batch(self):
            return BatchBuilder(batch_sender.BATCH_BYTES, 0)

    records = [SpoolRecord("agent.events", b"t", f"e{i}", b"v" * 2600, i) for i in range(2000)]
    batches = _fill(_Large(), "agent.events", 0, records)
    assert len(batches) == 6  # about 380 steps a batch, not about 95 as with 256 KiB
    assert all(b.builder.size() <= batch_sender.BATCH_BYTES for b in batches)
    assert [r for b in batches for r in b.records] == records

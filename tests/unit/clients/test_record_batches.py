"""The one record-batch sender (the SDK's delivery and the stream roles): messages land in the
partition every Kafka client picks for their key, grouped into as few record batches as the batch
size allows, in order; a message larger than a batch is sent alone, never dropped."""

from __future__ import annotations

import uuid

from aiokafka.partitioner import DefaultPartitioner
from kafka.partitioner.default import murmur2

from clients.kafka.record_batches import LARGE_BATCH_BYTES, KeyPartitions, _fill


def test_a_key_gets_the_partition_both_clients_default_partitioners_give_it():
    partitions = [0, 1, 2, 3, 4, 5]
    aiokafka_default = DefaultPartitioner()
    for _ in range(500):
        key = str(uuid.uuid4()).encode()
        expected = partitions[(murmur2(key) & 0x7FFFFFFF) % len(partitions)]
        assert KeyPartitions().of(key, partitions) == expected
        assert aiokafka_default(key, partitions, partitions) == expected


def test_one_hash_per_key_and_partition_count_serves_every_topic(monkeypatch):
    from clients.kafka import record_batches

    calls = []
    real = record_batches.murmur2_index
    monkeypatch.setattr(record_batches, "murmur2_index", lambda k, n: calls.append((k, n)) or real(k, n))
    cache = KeyPartitions()
    keys = [f"trajectory-{i}".encode() for i in range(300)]
    for key in keys:
        for count in (4, 4, 4, 1, 8):  # agent.events, reward.rule, trajectory.scored, ...
            assert cache.of(key, list(range(count))) == real(key, count)
    assert len(calls) == len(keys) * 3


def test_the_partition_cache_stays_bounded_and_keyless_messages_are_not_cached():
    cache = KeyPartitions(max_keys=3)
    for i in range(10):
        key = f"t{i}".encode()
        assert cache.of(key, [0, 1]) == (murmur2(key) & 0x7FFFFFFF) % 2
        assert len(cache._slots) <= 3
    for _ in range(5):
        assert cache.of(None, [0, 1, 2]) in range(3)
    assert all(key is not None for _, key in cache._slots)


class _Producer:
    """What `_fill` uses of aiokafka's producer: `create_batch` (the real batch builder)."""

    def __init__(self, batch_bytes: int = 16 * 1024):
        self.batch_bytes = batch_bytes

    def create_batch(self):
        from aiokafka.producer.message_accumulator import BatchBuilder

        return BatchBuilder(self.batch_bytes, 0)


def test_messages_fill_as_few_batches_as_fit_and_keep_their_order():
    messages = [("agent.events", b"t", b"v" * 3000) for _ in range(12)]
    batches = _fill(_Producer(), messages, list(range(12)))
    assert len(batches) == 3  # 5 records of ~3 KB fit in 16 KiB
    assert [i for _, held in batches for i in held] == list(range(12))
    assert [b.record_count() for b, _ in batches] == [len(held) for _, held in batches]


def test_a_message_larger_than_a_batch_goes_alone_in_its_own_and_is_never_dropped():
    messages = [("agent.events", b"t", b"v" * 3000), ("agent.events", b"t", b"v" * 40_000)]
    messages.append(("agent.events", b"t", b"v" * 10))
    batches = _fill(_Producer(), messages, [0, 1, 2])
    assert [held for _, held in batches] == [[0], [1], [2]]
    assert [b.record_count() for b, _ in batches] == [1, 1, 1]


def test_a_chunk_of_2kb_steps_goes_in_batches_of_up_to_a_megabyte_that_any_broker_takes():
    from infra.broker.log_config import LogConfig

    kafka_default_max_message_bytes = 1_048_588
    broker_limit = min(kafka_default_max_message_bytes, LogConfig().max_message_bytes)
    assert broker_limit > LARGE_BATCH_BYTES
    messages = [("agent.events", b"t", b"v" * 2600) for _ in range(2000)]
    batches = _fill(_Producer(LARGE_BATCH_BYTES), messages, list(range(2000)))
    assert len(batches) == 6  # about 380 steps a batch, not about 95 as with 256 KiB
    assert all(b.size() <= LARGE_BATCH_BYTES for b, _ in batches)
    assert [i for _, held in batches for i in held] == list(range(2000))

"""The partition cache of the stream roles' bulk sends agrees with aiokafka's own partitioner."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner

from streams import produce


class _Producer:
    """What `faust_compat.partition_for` calls: aiokafka's `_partition` over partitions 0..n-1."""

    def __init__(self, counts: dict[str, int]):
        self.counts = counts
        self.calls = 0

    def _partition(self, topic, partition, key, value, serialized_key, serialized_value):
        self.calls += 1
        partitions = list(range(self.counts[topic]))
        return DefaultPartitioner()(serialized_key, partitions, partitions)


def test_cached_partitions_match_the_partitioner_across_topics_and_counts():
    counts = {"agent.events": 4, "reward.rule": 4, "trajectory.scored": 4, "one": 1, "eight": 8}
    aio, reference = _Producer(counts), _Producer(counts)
    produce._PARTITIONS.clear()
    keys = [f"trajectory-{i}".encode() for i in range(300)]
    for key in keys:
        for topic, count in counts.items():
            expected = reference._partition(topic, None, None, None, key, None)
            assert produce._partition(aio, topic, count, key, None) == expected, (topic, key)
    # one hash per key and partition count, not per topic
    assert aio.calls == len(keys) * len(set(counts.values()))


def test_keyless_records_are_not_cached():
    aio = _Producer({"t": 3})
    produce._PARTITIONS.clear()
    for _ in range(5):
        assert produce._partition(aio, "t", 3, None, b"v") in range(3)
    assert aio.calls == 5 and not produce._PARTITIONS

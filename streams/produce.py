"""Bulk sending for the stream processors: one record batch per partition, awaited together.

Uses the aiokafka producer that faust runs (through streams/faust_compat.py), so the worker has one
producer and faust's pre-commit flush covers these sends too.
"""

from __future__ import annotations

import asyncio

from streams import faust_compat


async def send_all(app, messages: list[tuple[str, bytes | None, bytes | None]]) -> None:
    """Send (topic, key, value) messages and wait for all acknowledgements.

    Messages are grouped into one record batch per partition and handed to aiokafka's batch API
    (`create_batch` / `send_batch`) on the producer faust already runs: per-message `send` cost
    more than the rule computation itself. Partitions come from aiokafka's own key partitioner,
    so keys land where a plain `send` (and faust's `use_partitioner` tables) would put them."""
    if not messages:
        return
    aio = faust_compat.aiokafka_producer(app)
    for topic in {m[0] for m in messages}:
        await faust_compat.wait_for_metadata(aio, topic)
    futures = [
        await aio.send_batch(batch, topic, partition=partition)
        for (topic, partition), items in _by_partition(aio, messages).items()
        for batch in _batches(aio, items)
    ]
    await asyncio.gather(*futures)


# (partition count, key) -> partition: a trajectory's key is partitioned again for each of its
# outputs and table updates, and aiokafka's murmur2 is pure Python (2% of a role's CPU uncached). The
# default partitioner's choice depends on the key and the partition count alone (murmur2 modulo the
# count; partition ids run from 0), so one hash serves every topic: a new trajectory's key was
# hashed once per topic it went to (four in the scoring role, 3.5% of its CPU at 1,000 steps/s).
_PARTITIONS: dict[tuple[int, bytes], int] = {}
_PARTITIONS_MAX = 100_000


def _by_partition(aio, messages) -> dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]]:
    counts = {topic: faust_compat.partition_count(aio, topic) for topic in {m[0] for m in messages}}
    by_tp: dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]] = {}
    for topic, key, value in messages:
        by_tp.setdefault((topic, _partition(aio, topic, counts[topic], key, value)), []).append((key, value))
    return by_tp


def _partition(aio, topic: str, count: int, key: bytes | None, value: bytes | None) -> int:
    if key is None:  # keyless: the partitioner picks one at random each time
        return faust_compat.partition_for(aio, topic, key, value)
    slot = (count, key)
    partition = _PARTITIONS.get(slot)
    if partition is None:
        if len(_PARTITIONS) >= _PARTITIONS_MAX:
            _PARTITIONS.clear()
        partition = _PARTITIONS[slot] = faust_compat.partition_for(aio, topic, key, value)
    return partition


def _batches(aio, items):
    """Record batches holding `items`, a new one whenever the current one is full."""
    batch = aio.create_batch()
    for key, value in items:
        if batch.append(timestamp=None, key=key, value=value, headers=[]) is None:
            yield batch
            batch = aio.create_batch()
            batch.append(timestamp=None, key=key, value=value, headers=[])
    yield batch

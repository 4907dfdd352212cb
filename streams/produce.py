"""Bulk sending for the stream processors: `clients.kafka.record_batches` on the aiokafka producer
faust runs (through streams/faust_compat.py), so the worker has one producer and faust's pre-commit
flush covers these sends too. Owns only that binding and the worker's key -> partition memory.
"""

from __future__ import annotations

from clients.kafka import record_batches
from streams import faust_compat

# One per worker: a trajectory's key is partitioned again for each of its outputs and table updates;
# the default partitioner's choice depends on the key and the partition count alone, so one hash
# serves every topic (a new key was hashed once per topic: 3.5% of the scoring role's CPU).
PARTITIONS = record_batches.KeyPartitions(max_keys=100_000)


async def send_all(app, messages: list[tuple[str, bytes | None, bytes | None]]) -> None:
    """Send (topic, key, value) messages as one record batch per partition and wait for all
    acknowledgements."""
    await record_batches.send_all(faust_compat.aiokafka_producer(app), messages, PARTITIONS)

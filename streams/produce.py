"""Bulk sending for the stream processors: one record batch per partition, awaited together.

Uses the aiokafka producer that faust runs (faust internals: `Producer._ensure_producer`), so the
worker has one producer and faust's pre-commit flush covers these sends too.
"""

from __future__ import annotations

import asyncio


async def send_all(app, messages: list[tuple[str, bytes, bytes]]) -> None:
    """Send (topic, key, value) messages and wait for all acknowledgements.

    Messages are grouped into one record batch per partition and handed to aiokafka's batch API
    (`create_batch` / `send_batch`) on the producer faust already runs: per-message `send` cost
    more than the rule computation itself. Partitions come from aiokafka's own key partitioner,
    so keys land where a plain `send` (and faust's `use_partitioner` tables) would put them."""
    if not messages:
        return
    aio = app.producer._ensure_producer()  # the aiokafka producer inside faust's
    partitions: dict[tuple[str, bytes], int] = {}
    by_tp: dict[tuple[str, int], list[tuple[bytes, bytes]]] = {}
    for topic in {m[0] for m in messages}:
        await aio.client._wait_on_metadata(topic)
    for topic, key, value in messages:
        slot = (topic, key)
        partition = partitions.get(slot)
        if partition is None:
            partition = partitions[slot] = aio._partition(topic, None, None, None, key, value)
        by_tp.setdefault((topic, partition), []).append((key, value))
    futures = []
    for (topic, partition), items in by_tp.items():
        batch = aio.create_batch()
        for key, value in items:
            if batch.append(timestamp=None, key=key, value=value, headers=[]) is None:
                futures.append(await aio.send_batch(batch, topic, partition=partition))
                batch = aio.create_batch()
                batch.append(timestamp=None, key=key, value=value, headers=[])
        futures.append(await aio.send_batch(batch, topic, partition=partition))
    await asyncio.gather(*futures)

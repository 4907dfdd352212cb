"""Sends spool records to Kafka as record batches built here, through aiokafka in a private loop.

The delivery thread hands over one chunk at a time (`BatchSender.send`). Each chunk is grouped by
topic partition (the key's partition, computed once per key with the murmur2 partitioner every
Kafka client shares, so a trajectory lands where any other producer would put it), appended to
aiokafka's record batch builder (C code) and sent with `send_batch`; the call returns once the broker
acknowledged every batch (acks=all, idempotence on) or raises `DeliveryFailed`. Per record this costs
one dict look-up and one C append, against kafka-python's per-record `send` (partitioner, future,
accumulator lock, size checks), which was the largest share of the SDK's CPU per step.

The event loop is this object's own and runs only inside `send` / `close`, in the caller's thread:
aiokafka's background tasks (sender, metadata) make progress while a chunk is in flight and are
suspended in between. Order within a partition: aiokafka sends a partition's batches one after the
other and an idempotent producer keeps their order across retries.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from producers.errors import DeliveryFailed
from producers.spool import SpoolRecord

log = logging.getLogger(__name__)

_KEYS_CACHED = 4096  # partitions remembered per topic (by key), so murmur2 runs once per trajectory

# The largest record batch this sender builds: just under Kafka's default max.message.bytes (1,048,588,
# also the embedded broker's). A produce request carries one batch per partition and aiokafka keeps one
# request in flight per broker, each acknowledged after the broker's fsync round, so with the project's
# 256 KiB a 2,000-step chunk of 2 KB steps took about six round trips; with this, two (bench produce:
# flat out 6.2k -> 13.3k steps/s, 64 -> 54 µs of CPU per step).
BATCH_BYTES = 1_000_000


@dataclass(frozen=True)
class SenderConfig:
    """The producer settings `BatchSender` needs (a subset of `producers.delivery.DeliveryConfig`)."""

    bootstrap_servers: str
    client_id: str
    request_timeout_ms: int
    delivery_timeout_ms: int
    connect_timeout_ms: int


@dataclass
class _Batch:
    topic: str
    partition: int
    records: list[SpoolRecord]
    builder: object
    future: asyncio.Future | None = None


class BatchSender:
    """One aiokafka producer and the event loop it lives in; used from one thread at a time."""

    def __init__(self, config: SenderConfig):
        self.config = config
        self._loop: asyncio.AbstractEventLoop | None = None
        self._producer = None
        self._partitions: dict[str, tuple[list[int], dict[bytes, int]]] = {}

    # --- the public, synchronous face -------------------------------------------------------------

    def connect(self) -> None:
        """Start the producer if needed; raises (within `connect_timeout_ms`) when the broker is
        unreachable."""
        if self._producer is None:
            self._run(self._start(), self.config.connect_timeout_ms / 1000)

    def send(self, records: list[SpoolRecord]) -> dict[str, dict[int, int]]:
        """Send `records` and wait for the broker's acknowledgement of all of them. Returns, per topic
        and partition written, the offset after the last record stored there."""
        self.connect()
        return self._run(self._send(records), self.config.delivery_timeout_ms / 1000 + 1)

    def close(self) -> None:
        """Stop the producer (bounded wait) and the loop; the next `send` starts afresh."""
        loop, producer = self._loop, self._producer
        self._loop, self._producer = None, None
        self._partitions.clear()
        if loop is None:
            return
        try:
            if producer is not None:
                loop.run_until_complete(asyncio.wait_for(producer.stop(), 2.0))
        except BaseException:  # closing a broken client must not mask the original failure
            log.debug("error stopping the aiokafka producer", exc_info=True)
        finally:
            _close_loop(loop)

    # --- inside the loop --------------------------------------------------------------------------

    def _run(self, coro, timeout_s: float):
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        try:
            return self._loop.run_until_complete(asyncio.wait_for(coro, timeout_s))
        except TimeoutError:
            raise DeliveryFailed(
                f"no answer from {self.config.bootstrap_servers} within {timeout_s:.1f} s"
            ) from None

    async def _start(self) -> None:
        from clients.kafka import make_async_producer

        cfg = self.config
        producer = make_async_producer(
            cfg.bootstrap_servers,
            cfg.client_id,
            enable_idempotence=True,
            linger_ms=0,  # the batches are complete when handed over
            max_batch_size=BATCH_BYTES,
            request_timeout_ms=cfg.request_timeout_ms,
        )
        try:
            await producer.start()
        except BaseException:
            await producer.stop()
            raise
        self._producer = producer

    async def _send(self, records: list[SpoolRecord]) -> dict[str, dict[int, int]]:
        producer = self._producer
        groups: dict[tuple[str, int], list[SpoolRecord]] = {}
        for topic in {r.topic for r in records}:
            await self._refresh_partitions(topic)
        for record in records:
            all_partitions, by_key = self._partitions[record.topic]
            partition = by_key.get(record.key)
            if partition is None:
                partition = _cache_partition(by_key, record.key, all_partitions)
            groups.setdefault((record.topic, partition), []).append(record)
        batches: list[_Batch] = []
        for (topic, partition), group in groups.items():
            for batch in _fill(producer, topic, partition, group):
                batch.future = await producer.send_batch(batch.builder, topic, partition=partition)
                batches.append(batch)
        ends: dict[str, dict[int, int]] = {}
        for batch in batches:
            try:
                metadata = await batch.future
            except Exception as exc:
                first = batch.records[0]
                raise DeliveryFailed(
                    f"send of {len(batch.records)} events from {first.event_id} (seq {first.seq}) to "
                    f"{batch.topic}[{batch.partition}] failed: {exc!r}"
                ) from None
            end = metadata.offset + len(batch.records)
            parts = ends.setdefault(batch.topic, {})
            parts[batch.partition] = max(parts.get(batch.partition, 0), end)
        return ends

    async def _refresh_partitions(self, topic: str) -> None:
        known = await self._producer.partitions_for(topic)
        if not known:
            raise DeliveryFailed(f"topic {topic!r} has no partitions (does it exist?)")
        all_partitions = sorted(known)
        cached = self._partitions.get(topic)
        if cached is None or cached[0] != all_partitions:
            self._partitions[topic] = (all_partitions, {})


def _fill(producer, topic: str, partition: int, records: list[SpoolRecord]) -> list[_Batch]:
    """`records` appended to as few record batches as the batch size allows."""
    out = []
    builder, start = producer.create_batch(), 0
    for i, record in enumerate(records):
        if builder.append(key=record.key, value=record.value, timestamp=None) is None:
            if i == start:
                raise DeliveryFailed(
                    f"event {record.event_id} (seq {record.seq}): {len(record.value)} bytes do not fit "
                    "in one record batch"
                )
            out.append(_Batch(topic, partition, records[start:i], builder))
            builder, start = producer.create_batch(), i
            builder.append(key=record.key, value=record.value, timestamp=None)
    out.append(_Batch(topic, partition, records[start:], builder))
    return out


def _cache_partition(by_key: dict[bytes, int], key: bytes, all_partitions: list[int]) -> int:
    """`key`'s partition, remembered in `by_key` (cleared when full: one key per trajectory)."""
    if len(by_key) >= _KEYS_CACHED:
        by_key.clear()
    partition = by_key[key] = _partition_for(key, all_partitions)
    return partition


def _partition_for(key: bytes, all_partitions: list[int]) -> int:
    """The partition the default partitioner of Kafka's clients picks for `key` (murmur2)."""
    from aiokafka.partitioner import murmur2

    return all_partitions[(murmur2(key) & 0x7FFFFFFF) % len(all_partitions)]


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left in `loop` (a broken producer's tasks), let it unwind, close the loop."""
    try:
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.wait(tasks, timeout=1.0))
        loop.run_until_complete(loop.shutdown_asyncgens())
    except BaseException:
        log.debug("error unwinding the delivery loop", exc_info=True)
    finally:
        loop.close()

"""Send messages as record batches built here: one batch per partition (more when one is full), each
handed to aiokafka's batch API (`create_batch` / `send_batch`), all awaited together.

Per message this costs one dict look-up and one C append, against a plain `send`'s partitioner,
future, accumulator lock and size checks, which cost more than the work of the stream roles and
were the largest share of the SDK's CPU per step. Used by the SDK's delivery thread (through
`RecordBatchSender`'s own event loop) and by the stream processors (on the producer faust runs).

Partitions are the ones the default partitioner of every Kafka client picks (murmur2 of the key
modulo the partition count), computed once per key: a trajectory's key is partitioned again for each
of its outputs, and aiokafka's murmur2 is pure Python. Order within a partition: aiokafka sends a
partition's batches one after the other, and an idempotent producer keeps their order on retries.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from schemas.errors import AgentstreamError

log = logging.getLogger(__name__)

Message = tuple[str, bytes | None, bytes | None]  # (topic, key, value)

# The largest record batch `RecordBatchSender` builds: just under Kafka's default max.message.bytes
# (1,048,588, also the embedded broker's). A produce request carries one batch per partition and
# aiokafka keeps one request in flight per broker, each acknowledged after the broker's fsync round,
# so with the project's 256 KiB a 2,000-step chunk of 2 KB steps took about six round trips; with
# this, two (bench produce: flat out 6.2k -> 13.3k steps/s, 64 -> 54 µs of CPU per step).
LARGE_BATCH_BYTES = 1_000_000


class RecordBatchError(AgentstreamError):
    """A message that fits in no record batch, a topic without partitions, a refused batch, or no
    answer in time; `index` is the (first) message concerned, when there is one."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


class KeyPartitions:
    """key -> partition, as Kafka's default partitioner picks it, remembered for `max_keys` keys
    (cleared when full: one key per trajectory)."""

    def __init__(self, max_keys: int = 100_000):
        self.max_keys = max_keys
        self._slots: dict[tuple[int, bytes], int] = {}

    def of(self, key: bytes | None, partitions: Sequence[int]) -> int:
        """`key`'s partition among `partitions` (sorted ids); a keyless message goes to a random one.

        >>> KeyPartitions().of(b"t-1", [0, 1, 2, 3]) == KeyPartitions().of(b"t-1", [0, 1, 2, 3])
        True
        """
        if key is None:
            return random.choice(partitions)
        slot = (len(partitions), key)
        index = self._slots.get(slot)
        if index is None:
            if len(self._slots) >= self.max_keys:
                self._slots.clear()
            index = self._slots[slot] = murmur2_index(key, len(partitions))
        return partitions[index]


def murmur2_index(key: bytes, count: int) -> int:
    """The index the default partitioner of Kafka's clients picks for `key` among `count` partitions."""
    from aiokafka.partitioner import murmur2

    return (murmur2(key) & 0x7FFFFFFF) % count


@dataclass
class SentBatch:
    """One record batch handed to the producer: where it went, which messages (indices into the
    caller's list) it holds, and the future of its acknowledgement."""

    topic: str
    partition: int
    indices: list[int] = field(default_factory=list)
    future: asyncio.Future | None = None


async def send_batches(producer, messages: Sequence[Message], partitions: KeyPartitions) -> list[SentBatch]:
    """Hand `messages` to a started aiokafka `producer` as record batches; returns them with their
    acknowledgement futures (not awaited: `send_all` awaits them, the SDK reads their offsets)."""
    known: dict[str, list[int]] = {}
    for topic in {m[0] for m in messages}:
        found = await producer.partitions_for(topic)  # waits for the topic's metadata
        if not found:
            raise RecordBatchError(f"topic {topic!r} has no partitions (does it exist?)")
        known[topic] = sorted(found)
    by_partition: dict[tuple[str, int], list[int]] = {}
    for i, (topic, key, _) in enumerate(messages):
        by_partition.setdefault((topic, partitions.of(key, known[topic])), []).append(i)
    sent = []
    for (topic, partition), indices in by_partition.items():
        for batch, held in _fill(producer, messages, indices):
            sent.append(SentBatch(topic, partition, held))
            sent[-1].future = await producer.send_batch(batch, topic, partition=partition)
    return sent


async def send_all(producer, messages: Sequence[Message], partitions: KeyPartitions) -> None:
    """Send `messages` and wait for every acknowledgement (the stream roles' bulk send)."""
    if messages:
        await asyncio.gather(*(b.future for b in await send_batches(producer, messages, partitions)))


def _fill(producer, messages: Sequence[Message], indices: list[int]) -> list[tuple[object, list[int]]]:
    """The messages at `indices` appended to as few record batches as the batch size allows."""
    out: list[tuple[object, list[int]]] = []
    builder, held = producer.create_batch(), []
    for i in indices:
        topic, key, value = messages[i]
        if builder.append(key=key, value=value, timestamp=None) is None:
            if held:  # full: start the next batch
                out.append((builder, held))
                builder, held = producer.create_batch(), []
            if builder.append(key=key, value=value, timestamp=None) is None:
                size = len(value or b"") + len(key or b"")
                raise RecordBatchError(
                    f"{topic}: message {i} of {size} bytes does not fit in one record batch", index=i
                )
        held.append(i)
    out.append((builder, held))
    return out


@dataclass(frozen=True)
class SenderConfig:
    """The producer settings `RecordBatchSender` needs."""

    bootstrap_servers: str
    client_id: str
    request_timeout_ms: int
    delivery_timeout_ms: int
    connect_timeout_ms: int


class RecordBatchSender:
    """`send_batches` from synchronous code: one idempotent aiokafka producer and the event loop it
    lives in, used from one thread at a time (the SDK's delivery thread). The loop runs only inside
    `send` / `connect` / `close`, in the caller's thread: aiokafka's background tasks (sender,
    metadata) make progress while a chunk is in flight and are suspended in between."""

    def __init__(self, config: SenderConfig, max_keys: int = 4096):
        self.config = config
        self.partitions = KeyPartitions(max_keys)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._producer = None

    def connect(self) -> None:
        """Start the producer if needed; raises (within `connect_timeout_ms`) when the broker is
        unreachable."""
        if self._producer is None:
            self._run(self._start(), self.config.connect_timeout_ms / 1000)

    def send(self, messages: Sequence[Message]) -> dict[str, dict[int, int]]:
        """Send `messages` and wait for the broker's acknowledgement of all of them. Returns, per topic
        and partition written, the offset after the last message stored there. A refused batch raises
        `RecordBatchError` whose `index` is its first message."""
        self.connect()
        return self._run(self._send(messages), self.config.delivery_timeout_ms / 1000 + 1)

    def close(self) -> None:
        """Stop the producer (bounded wait) and the loop; the next `send` starts afresh."""
        loop, producer = self._loop, self._producer
        self._loop, self._producer = None, None
        if loop is None:
            return
        try:
            if producer is not None:
                loop.run_until_complete(asyncio.wait_for(producer.stop(), 2.0))
        except BaseException:  # closing a broken client must not mask the original failure
            log.debug("error stopping the aiokafka producer", exc_info=True)
        finally:
            _close_loop(loop)

    def _run(self, coro, timeout_s: float):
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        try:
            return self._loop.run_until_complete(asyncio.wait_for(coro, timeout_s))
        except TimeoutError:
            raise RecordBatchError(
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
            max_batch_size=LARGE_BATCH_BYTES,
            request_timeout_ms=cfg.request_timeout_ms,
        )
        try:
            await producer.start()
        except BaseException:
            await producer.stop()
            raise
        self._producer = producer

    async def _send(self, messages: Sequence[Message]) -> dict[str, dict[int, int]]:
        ends: dict[str, dict[int, int]] = {}
        for batch in await send_batches(self._producer, messages, self.partitions):
            try:
                metadata = await batch.future
            except Exception as exc:
                raise RecordBatchError(
                    f"send of {len(batch.indices)} messages to {batch.topic}[{batch.partition}] "
                    f"failed: {exc!r}",
                    index=batch.indices[0],
                ) from None
            parts = ends.setdefault(batch.topic, {})
            parts[batch.partition] = max(parts.get(batch.partition, 0), metadata.offset + len(batch.indices))
        return ends


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

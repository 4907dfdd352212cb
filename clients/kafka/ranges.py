"""Reading a range of a topic: from a start (the beginning, or given offsets) up to the end offsets
taken when the read starts, and following a topic past its end.

These are the only read-to-end and follow loops in the project (sync for kafka-python consumers, async
for aiokafka ones); callers hand in a consumer from the factory (`clients.kafka`) and get
`schemas.records.Record`s with their coordinates. Must not create consumers or commit offsets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping

from schemas.errors import AgentstreamError
from schemas.records import Record

log = logging.getLogger(__name__)

POLL_MS = 200


class ReadIncomplete(AgentstreamError):
    """A strict read did not reach the end offsets in time (a partial read would mislead)."""


def topic_partitions(consumer, topics: Iterable[str]) -> list:
    """Every `TopicPartition` of `topics` the consumer's metadata knows, in order (none for a topic
    that does not exist)."""
    from kafka import TopicPartition

    return [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]


def as_record(message) -> Record:
    """A consumed kafka-python / aiokafka message as a `Record` with its coordinates."""
    return Record(
        message.topic, message.partition, message.offset, message.key, message.value, message.timestamp
    )


def iter_range(
    consumer,
    parts: list,
    start: Mapping | None = None,
    *,
    timeout_s: float = 30.0,
    strict: bool = False,
    max_records: int | None = None,
) -> Iterator[Record]:
    """The records of `parts` from `start` (per `TopicPartition`; None: the beginning) up to their
    end offsets now. After `timeout_s` it raises `ReadIncomplete` when `strict`, else stops with a
    warning. Assigns `parts` to `consumer` (no group, nothing committed)."""
    if not parts:
        return
    consumer.assign(parts)
    if start is None:
        consumer.seek_to_beginning(*parts)
    else:
        for tp in parts:
            consumer.seek(tp, start[tp])
    end = consumer.end_offsets(parts)
    deadline, read = time.monotonic() + timeout_s, 0
    while any(consumer.position(tp) < end[tp] for tp in parts):
        if time.monotonic() > deadline:
            names = sorted({tp.topic for tp in parts})
            message = f"read {read} records of {names} but not to their end in {timeout_s:.0f}s"
            if strict:
                raise ReadIncomplete(message)
            log.warning("%s; going on with what was read", message)
            return
        polled = consumer.poll(timeout_ms=POLL_MS, **({"max_records": max_records} if max_records else {}))
        for tp, batch in polled.items():
            for message in batch:
                if message.offset < end[tp]:
                    read += 1
                    yield as_record(message)
    _rewind_past_end(consumer, parts, end)


def _rewind_past_end(consumer, parts: list, end: Mapping) -> None:
    """A fetch may return records past the end offsets: seek back so that whoever follows the
    consumer next sees them (they were not handed out)."""
    for tp in parts:
        if consumer.position(tp) > end[tp]:
            consumer.seek(tp, end[tp])


def follow(
    consumer, stop: Callable[[], bool], *, poll_ms: int = 500, max_records: int | None = None
) -> Iterator[list[Record]]:
    """Each poll's records (possibly none) from the consumer's current positions until `stop()`; an
    empty list lets the caller act on idleness."""
    options = {"max_records": max_records} if max_records else {}
    while not stop():
        polled = consumer.poll(timeout_ms=poll_ms, **options)
        yield [as_record(m) for batch in polled.values() for m in batch]


async def iter_range_async(consumer, parts: list) -> AsyncIterator[Record]:
    """`iter_range` for a started aiokafka consumer: `parts` from the beginning to the end offsets
    now (no deadline: the caller bounds the wait)."""
    if not parts:
        return
    consumer.assign(parts)
    await consumer.seek_to_beginning(*parts)
    end = await consumer.end_offsets(parts)
    while [tp for tp in parts if await consumer.position(tp) < end[tp]]:
        for tp, batch in (await consumer.getmany(timeout_ms=POLL_MS)).items():
            for message in batch:
                if message.offset < end[tp]:
                    yield as_record(message)
    for tp in parts:  # as `_rewind_past_end`: what a fetch returned past the end is read again
        if await consumer.position(tp) > end[tp]:
            consumer.seek(tp, end[tp])


async def follow_async(consumer) -> AsyncIterator[Record]:
    """Every record from a started aiokafka consumer's positions on, until cancelled."""
    while True:
        for batch in (await consumer.getmany(timeout_ms=POLL_MS)).values():
            for message in batch:
                yield as_record(message)

"""Paced fetches (clients/fetch_pacing.py) with the real aiokafka against the real embedded broker:
an idle consumer long-polls instead of fetching every `fetch_max_wait_ms`, and a record appended
while it waits is answered at once, not at the end of the wait."""

from __future__ import annotations

import asyncio
import time

from clients.fetch_pacing import pace_fetches
from clients.kafka import ensure_topics
from schemas.topics import AGENT_EVENTS, TOPICS
from streams import faust_compat

IDLE_WAIT_MS = 3000  # far longer than any delivery below may take
SIZED = {"fetch_min_bytes": 64 * 1024, "fetch_max_wait_ms": 25}  # the stream roles' sizing


def _consumer(bootstrap: str, **sizing):
    from aiokafka import AIOKafkaConsumer

    return AIOKafkaConsumer(AGENT_EVENTS, bootstrap_servers=bootstrap, auto_offset_reset="earliest", **sizing)


async def _idle_then_one_record(bootstrap: str, make, start) -> dict:
    """Start `make()` with `start`, leave it 2 s with nothing to read, then append one record."""
    from aiokafka import AIOKafkaProducer

    consumer = make()  # aiokafka objects are made inside the loop
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await start(consumer)
    await producer.start()
    try:
        while not consumer.assignment():
            await asyncio.sleep(0.05)
        pacing = consumer._agentstream_fetch_pacing
        await asyncio.sleep(2.0)  # unpaced, a fetch every 25 ms: about 80
        idle = pacing.fetches
        sent = time.monotonic()
        await producer.send_and_wait(AGENT_EVENTS, b"after a quiet spell", key=b"t-1")
        message = await asyncio.wait_for(consumer.getone(), timeout=30)
        return {
            "idle_fetches": idle,
            "delivery_s": time.monotonic() - sent,
            "value": message.value,
            "with_records": pacing.fetches - pacing.empty,
        }
    finally:
        await producer.stop()
        await consumer.stop()


def test_an_idle_consumer_long_polls_and_a_new_record_is_answered_at_once(broker):
    ensure_topics(broker.bootstrap, [TOPICS[AGENT_EVENTS]])

    async def start_paced(consumer) -> None:
        await consumer.start()
        pace_fetches(consumer, IDLE_WAIT_MS)

    make = lambda: _consumer(broker.bootstrap, **SIZED)  # noqa: E731
    seen = asyncio.run(_idle_then_one_record(broker.bootstrap, make, start_paced))
    assert seen["value"] == b"after a quiet spell"
    assert seen["idle_fetches"] <= 16, seen  # a quarter second of sized fetches, then 3 s long polls
    assert seen["delivery_s"] < IDLE_WAIT_MS / 1000 / 2, seen  # the held fetch answered at the first byte
    assert seen["with_records"] == 1, seen


def test_the_stream_roles_consumer_is_paced_once_faust_starts_it(broker):
    """faust creates the roles' consumer and starts it itself: `_sized_fetches` sizes it and wraps
    its `start`, so the pacing is applied once the fetcher exists (streams/faust_compat.py)."""
    ensure_topics(broker.bootstrap, [TOPICS[AGENT_EVENTS]])

    class _Thread:  # what faust's AIOKafkaConsumerThread offers `_create_worker_consumer`
        class app:
            _agentstream_fetch = (SIZED["fetch_min_bytes"], SIZED["fetch_max_wait_ms"], IDLE_WAIT_MS)

    create = faust_compat._sized_fetches(lambda thread, transport: _consumer(broker.bootstrap))

    def make():
        consumer = create(_Thread(), None)
        assert (consumer._fetch_min_bytes, consumer._fetch_max_wait_ms) == (64 * 1024, 25)
        return consumer

    async def start_as_faust_does(consumer) -> None:
        await consumer.start()

    seen = asyncio.run(_idle_then_one_record(broker.bootstrap, make, start_as_faust_does))
    assert seen["value"] == b"after a quiet spell"
    assert seen["idle_fetches"] <= 16, seen
    assert seen["delivery_s"] < IDLE_WAIT_MS / 1000 / 2, seen

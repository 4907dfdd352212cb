"""The one consume loop (clients/kafka/consume.py) over aiokafka, against the real embedded broker:
a pipelined handler's offsets are committed only once its write is durable, a refused record's dead
letter is acknowledged before the commit that covers it, and a group member whose partitions move
to another member writes and commits what it consumed first (the next owner re-reads nothing)."""

from __future__ import annotations

import asyncio
import time

import orjson

from clients.kafka import ensure_topics, make_async_consumer, make_consumer, make_producer, read_to_end
from clients.kafka.consume import ConsumeLoop, LoopConfig, Refused
from clients.kafka.ranges import topic_partitions
from schemas.records import Record
from schemas.topics import AGENT_EVENTS, DLQ, TOPICS

GROUP = "test-consume-loop"
RECORDS = 40
BAD = b"bad"


class PipelinedWriter:
    """A handler that writes like the sink: `write` starts a slow write and returns; its positions
    are offered for commit once it finished. `due_every_cycle=False` writes only when forced."""

    def __init__(self, due_every_cycle: bool = True):
        self.due_every_cycle = due_every_cycle
        self.buffered: list[Record] = []
        self.written: set[tuple[str, int, int]] = set()
        self.positions: dict[tuple[str, int], int] = {}
        self.durable: dict[tuple[str, int], int] = {}
        self.running: asyncio.Task | None = None

    def handle(self, record: Record, now: float) -> None:
        self.positions[(record.topic, record.partition)] = record.offset + 1
        if record.value == BAD:
            raise Refused("value: expected an event, got b'bad'", "TestRefusal")
        self.buffered.append(record)

    async def write(self, now: float, force: bool) -> bool:
        if self.running is not None and (force or self.running.done()):
            self.durable.update(await self.running)
            self.running = None
        if not (force or self.due_every_cycle) or self.running is not None or not self.positions:
            return False
        self.running = asyncio.create_task(self._write(self.buffered, self.positions))
        self.buffered, self.positions = [], {}
        if force:
            self.durable.update(await self.running)
            self.running = None
        return True

    async def _write(self, records: list[Record], positions: dict) -> dict:
        await asyncio.sleep(0.3)  # the insert: polling goes on meanwhile
        self.written.update(r.coordinates for r in records)
        return positions

    def commit_positions(self, consumed: dict) -> dict:
        durable, self.durable = self.durable, {}
        return durable


def _publish(bootstrap: str) -> None:
    ensure_topics(bootstrap, [TOPICS[AGENT_EVENTS], TOPICS[DLQ]])
    producer = make_producer(bootstrap, "test-consume-loop")
    try:
        for i in range(RECORDS):
            value = BAD if i == 7 else f"{i}".encode()
            producer.send(AGENT_EVENTS, key=f"t-{i}".encode(), value=value).get(timeout=30)
    finally:
        producer.close()


def _watched(loop: ConsumeLoop, journal: list, refused: Record) -> None:
    """Journal every dead letter sent and every commit, each commit checked against the writes
    (every record below a committed offset is written, except the one refused)."""
    send, commit = loop.producer.send, loop.consumer.commit

    def sending(topic, key=None, value=None):
        letter = orjson.loads(value)
        journal.append(("letter", (letter["source_partition"], letter["source_offset"])))
        return send(topic, key=key, value=value)

    async def committing(offsets):
        for tp, offset in offsets.items():
            below = {(tp.topic, tp.partition, o) for o in range(offset)}
            assert below - {refused.coordinates} <= loop.handler.written, (
                f"{tp} committed at {offset} before its write"
            )
            journal.append(("commit", (tp.partition, offset)))
        await commit(offsets)

    loop.producer.send, loop.consumer.commit = sending, committing


def _loop(bootstrap: str, handler, producer) -> ConsumeLoop:
    consumer = make_async_consumer(bootstrap, GROUP, GROUP, session_timeout_ms=10_000)
    config = LoopConfig("test", poll_timeout_ms=100, write_all_on_stop=True)
    loop = ConsumeLoop(consumer, producer, handler, config)
    loop.subscribe([AGENT_EVENTS])
    return loop


def _committed(bootstrap: str) -> dict[int, int]:
    consumer = make_consumer(bootstrap, "test-consume-loop-check", GROUP)
    try:
        return {tp.partition: consumer.committed(tp) for tp in topic_partitions(consumer, [AGENT_EVENTS])}
    finally:
        consumer.close()


def _ends(bootstrap: str) -> dict[int, int]:
    consumer = make_consumer(bootstrap, "test-consume-loop-check")
    try:
        parts = topic_partitions(consumer, [AGENT_EVENTS])
        return {tp.partition: end for tp, end in consumer.end_offsets(parts).items()}
    finally:
        consumer.close()


async def _until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def test_pipelined_writes_commit_when_durable_and_letters_go_first(broker):
    _publish(broker.bootstrap)
    bad = next(r for r in read_to_end(broker.bootstrap, [AGENT_EVENTS]) if r.value == BAD)
    producer = make_producer(broker.bootstrap, "test-consume-loop-dlq")
    journal: list = []

    async def run() -> PipelinedWriter:
        handler = PipelinedWriter()
        loop = _loop(broker.bootstrap, handler, producer)
        _watched(loop, journal, bad)
        stop = asyncio.Event()
        await loop.consumer.start()
        task = asyncio.create_task(loop.run_async(stop.is_set))
        try:
            await _until(lambda: len(handler.written) == RECORDS - 1, 60, "every record written")
            await _until(lambda: _committed(broker.bootstrap) == _ends(broker.bootstrap), 30, "commits")
        finally:
            stop.set()
            await task
            await loop.consumer.stop()
        return handler

    try:
        asyncio.run(run())
    finally:
        producer.close()
    letter = ("letter", (bad.partition, bad.offset))
    assert journal.count(letter) == 1
    covering = next(
        i
        for i, e in enumerate(journal)
        if e[0] == "commit" and e[1][0] == bad.partition and e[1][1] > bad.offset
    )
    assert journal.index(letter) < covering
    letters = [orjson.loads(r.value) for r in read_to_end(broker.bootstrap, [DLQ])]
    assert [(d["stage"], d["source_offset"], d["error_type"]) for d in letters] == [
        ("test", bad.offset, "TestRefusal")
    ]


def test_a_member_losing_its_partitions_writes_and_commits_what_it_consumed_first(broker):
    _publish(broker.bootstrap)
    producer = make_producer(broker.bootstrap, "test-consume-loop-dlq")

    async def run() -> tuple[PipelinedWriter, PipelinedWriter, dict]:
        first_handler, second_handler = PipelinedWriter(due_every_cycle=False), PipelinedWriter()
        first = _loop(broker.bootstrap, first_handler, producer)
        await first.consumer.start()
        first_task = asyncio.create_task(first.run_async(lambda: False))
        second = None
        try:
            consumed = lambda: sum(first.consumed.values()) == RECORDS  # noqa: E731
            await _until(consumed, 60, "the first member to consume everything")
            assert not first_handler.written and all(v is None for v in _committed(broker.bootstrap).values())
            second = _loop(broker.bootstrap, second_handler, producer)
            await second.consumer.start()  # joining moves partitions: the first member's are revoked
            second_task = asyncio.create_task(second.run_async(lambda: False))
            await _until(lambda: second.consumer.assignment(), 60, "the second member's partitions")
            committed = _committed(broker.bootstrap)
            await asyncio.sleep(1.0)  # anything the second member were to re-read arrives by now
            second_task.cancel()
        finally:
            first_task.cancel()
            await first.consumer.stop()
            if second is not None:
                await second.consumer.stop()
        return first_handler, second_handler, committed

    try:
        first_handler, second_handler, committed = asyncio.run(run())
    finally:
        producer.close()
    assert len(first_handler.written) == RECORDS - 1  # written on revocation, not before
    assert committed == _ends(broker.bootstrap)
    assert second_handler.written == set() and second_handler.buffered == []

"""The consume -> handle -> write -> dead-letter -> commit loop every consuming stage runs.

One cycle: poll -> `handler.handle(record)` for each record (a record it cannot take becomes a dead
letter with its coordinates) -> `handler.write(...)` makes durable what is due -> the dead letters
are acknowledged -> the offsets `handler.commit_positions(...)` allows are committed. Nothing is
committed before what it covers is written, so a kill -9 anywhere re-delivers from the last commit
and loses nothing acknowledged.

What is poison (the record's fault, the same on every replay) versus an outage (the broker, the
disk, the device: raised, the process exits and the record is read again) is decided here, once
(`is_poison`). `ConsumeLoop.run` cycles a kafka-python consumer; an aiokafka stage (the sink, whose
writes are pipelined on a thread) drives the same steps (`take`, `due_commits`) from its own event
loop and publishes its dead letters with `clients.kafka.dead_letters` before it commits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from clients.kafka.dead_letters import letter_for, publish_dead_letters
from clients.kafka.ranges import as_record, topic_partitions
from schemas.errors import DecodeError
from schemas.events import DeadLetter
from schemas.records import Record

log = logging.getLogger(__name__)

# The record's own fault even though they are OS errors: the file an event points to is not there,
# not a file, or not ours to read. Any other OSError is the machine's.
POISON_OS_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)

Partition = tuple[str, int]


class Refused(Exception):
    """Raised by a handler for a record it can never take; becomes a dead letter with `reason`."""

    def __init__(self, reason: str, error_type: str = ""):
        super().__init__(reason)
        self.reason, self.error_type = reason, error_type or "Refused"


class RecordHandler(Protocol):
    """What a stage plugs into the loop."""

    def handle(self, record: Record, now: float) -> None:
        """Take one record (buffer it, or act on it). Raise `Refused` (or any poison) to refuse it."""

    def write(self, now: float, force: bool) -> bool:
        """Make durable what is due (everything when `force`); True when something was written."""

    def commit_positions(self, consumed: dict[Partition, int]) -> dict[Partition, int]:
        """Of the positions consumed, what may be committed now (e.g. held back by pending work)."""


def is_poison(exc: BaseException) -> bool:
    """The record's fault: it fails the same way on every replay.

    >>> is_poison(FileNotFoundError("x")), is_poison(ConnectionError()), is_poison(KeyError("prompt"))
    (True, False, True)
    """
    from aiokafka.errors import KafkaError as AsyncKafkaError
    from kafka.errors import KafkaError as SyncKafkaError

    if isinstance(exc, POISON_OS_ERRORS):
        return True
    return not isinstance(exc, SyncKafkaError | AsyncKafkaError | OSError | MemoryError)


@dataclass(frozen=True)
class LoopConfig:
    """How one stage runs the loop."""

    stage: str  # names its dead letters and log lines
    refusal: str = "cannot handle this record"  # starts the reason of an unexpected poison
    poll_timeout_ms: int = 500
    max_records: int | None = None
    idle_exit_s: float | None = None  # exit once nothing came and nothing was due this long


class ConsumeLoop:
    """One stage's loop over a consumer the caller created and assigned (or subscribed)."""

    def __init__(self, consumer, producer, handler: RecordHandler, config: LoopConfig):
        self.consumer, self.producer, self.handler, self.config = consumer, producer, handler, config
        self.consumed: dict[Partition, int] = {}
        self.committed: dict[Partition, int] = {}
        self.dead: list[DeadLetter] = []

    # --- the steps, shared by both cycles ---------------------------------------------------------

    def take(self, record: Record, now: float) -> None:
        """Hand one record to the handler; a refused one becomes a dead letter."""
        self.consumed[(record.topic, record.partition)] = record.offset + 1
        try:
            self.handler.handle(record, now)
        except Refused as exc:
            self.refuse(record, exc.reason, exc.error_type)
        except DecodeError as exc:
            self.refuse(record, exc.reason, "DecodeError")
        except Exception as exc:
            if not is_poison(exc):
                raise
            self.refuse(record, f"{self.config.refusal}: {exc!r}", type(exc).__name__)

    def refuse(self, record: Record, reason: str, error_type: str) -> None:
        log.warning("%s: refusing %s: %s", self.config.stage, record.describe(), reason[:500])
        self.dead.append(letter_for(self.config.stage, record, reason, error_type))

    def due_commits(self) -> dict[Partition, int]:
        positions = self.handler.commit_positions(dict(self.consumed))
        return {tp: off for tp, off in positions.items() if self.committed.get(tp) != off}

    def publish_dead(self) -> int:
        dead, self.dead = self.dead, []
        publish_dead_letters(self.producer, dead)
        return len(dead)

    # --- kafka-python ----------------------------------------------------------------------------

    def run(self, stop: Callable[[], bool]) -> None:
        """Cycle until `stop()` (or idle exit); raises on an outage (nothing uncommitted is lost)."""
        options = {"max_records": self.config.max_records} if self.config.max_records else {}
        last_input = time.monotonic()
        while not stop():
            polled = self.consumer.poll(timeout_ms=self.config.poll_timeout_ms, **options)
            now = time.monotonic()
            for batch in polled.values():
                for message in batch:
                    self.take(as_record(message), now)
            last_input = now if polled else last_input
            written = self.handler.write(now, False)
            self.settle()
            idle = self.config.idle_exit_s
            if idle is not None and not polled and not written and now - last_input >= idle:
                if self.handler.write(now, True):
                    self.settle()
                    continue
                log.info("%s: idle for %.1fs with nothing due, exiting", self.config.stage, idle)
                return

    def settle(self) -> None:
        """Dead letters acknowledged, then the commit (kafka-python)."""
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        self.publish_dead()
        changed = self.due_commits()
        if changed:
            self.consumer.commit(
                {TopicPartition(*tp): OffsetAndMetadata(o, "", -1) for tp, o in changed.items()}
            )
            self.committed.update(changed)


def assign_from_committed(consumer, topics: list[str], rewind: tuple[str, ...] = ()) -> dict[Partition, int]:
    """Assign every partition of `topics` to a kafka-python consumer (no group rebalancing), each at
    its group's committed offset (the reset policy where there is none); `rewind` topics from the
    beginning. Returns the committed offsets found."""
    parts = topic_partitions(consumer, topics)
    consumer.assign(parts)
    found: dict[Partition, int] = {}
    for tp in parts:
        if tp.topic in rewind:
            consumer.seek_to_beginning(tp)
            continue
        committed = consumer.committed(tp)
        if committed is not None:
            consumer.seek(tp, committed)
            found[(tp.topic, tp.partition)] = committed
    log.info("assigned %d partitions of %s", len(parts), ", ".join(topics))
    return found

"""A refused record as a `dead.letter`, and publishing dead letters before an offset is committed.

Every consuming stage (the sink, the trainer consumer, the executor) refuses a record the same way:
the letter carries the stage, the reason (bounded) and the source coordinates, is stamped with the
source record's time (so a replay re-creates the identical letter: same id, same time), is logged
with its coordinates, and is acknowledged by the broker before the offset that covers it is
committed. Must not decide what is poison; the stage does.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from schemas.codec import encode, encode_key
from schemas.deadletter import record_dead_letter
from schemas.events import DeadLetter
from schemas.records import Record
from schemas.topics import DLQ

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 2_000  # of a dead letter's reason: an exception's text may quote the whole input
ACK_TIMEOUT_S = 30


def letter_for(stage: str, source: Record, reason: str, error_type: str = "") -> DeadLetter:
    """The dead letter of `source` refused by `stage`.

    >>> letter_for("sink", Record("agent.events", 1, 7, b"t-1", b"{", 0), "x" * 3000).source_offset
    7
    """
    reason = reason if len(reason) <= MAX_REASON_CHARS else reason[:MAX_REASON_CHARS] + "..."
    letter = record_dead_letter(stage, source, reason, error_type)
    if source.timestamp_ms is None or source.timestamp_ms < 0:
        return letter
    when = datetime.fromtimestamp(source.timestamp_ms / 1000, UTC)
    return letter.model_copy(update={"occurred_at": when})


def publish_dead_letters(producer, letters: list[DeadLetter], topic: str = DLQ) -> None:
    """Send `letters` with a kafka-python producer and wait for every acknowledgement (raises when
    the broker did not take one: then the caller must not commit)."""
    if not letters:
        return
    for letter in letters:
        log.warning(
            "%s: dead letter topic=%s partition=%s offset=%s trajectory=%s: %s",
            letter.stage,
            letter.source_topic,
            letter.source_partition,
            letter.source_offset,
            letter.trajectory_id,
            letter.reason,
        )
    futures = [producer.send(topic, key=encode_key(d), value=encode(d)) for d in letters]
    producer.flush()
    for future in futures:
        future.get(timeout=ACK_TIMEOUT_S)

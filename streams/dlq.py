"""Dead letters from the stream processors: send `dead.letter` events to `agentstream.dlq`.

The DeadLetter itself is built by `schemas.deadletter.dead_letter` (deterministic id from the
stage and the source coordinates, so reprocessing the same record adds no second letter). This
module only sends them and logs one line per letter with the stage and the source coordinates.
"""

from __future__ import annotations

import logging

from schemas.codec import encode, encode_key
from schemas.events import DeadLetter
from schemas.topics import DLQ
from streams.produce import send_all

log = logging.getLogger(__name__)


async def send_dead_letters(app, stage: str, letters: list[DeadLetter]) -> None:
    """Send `letters` to the DLQ topic and wait until the broker acknowledged them."""
    for letter in letters:
        log.warning(
            "%s: to %s: %s (source %s[%s]@%s, trajectory %s)",
            stage,
            DLQ,
            letter.reason,
            letter.source_topic,
            letter.source_partition,
            letter.source_offset,
            letter.trajectory_id,
        )
    await send_all(app, [(DLQ, encode_key(letter), encode(letter)) for letter in letters])

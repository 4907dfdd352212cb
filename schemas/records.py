"""Where a record came from: the one record-coordinates type every stage uses.

A consumed Kafka record is carried with its coordinates (topic, partition, offset) so that anything
derived from it (a dead letter, a rejected row, a batch manifest, a policy's lineage) can name its
source. Plain data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Record:
    """One Kafka record: its coordinates, key and raw value (key and value may be absent when only
    the coordinates matter, e.g. in a batch manifest).

    >>> Record("agent.events", 2, 41, b"t-1", b"{}").coordinates
    ('agent.events', 2, 41)
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None = None
    value: bytes | None = None
    timestamp_ms: int | None = None

    @property
    def coordinates(self) -> tuple[str, int, int]:
        return (self.topic, self.partition, self.offset)

    def describe(self) -> str:
        """`topic[partition]@offset`, the form log lines and errors use."""
        return f"{self.topic}[{self.partition}]@{self.offset}"

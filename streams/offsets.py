"""Offset continuity: a record a worker never saw is a gap in its partition's offsets.

Our source topics are written without transactions and never compacted, so a partition's offsets
are contiguous. Within one consumer-group generation, the first record a worker sees of a partition
must be at (or, when re-delivered, before) the group's committed offset, and every next record at
most one past the highest seen. Anything beyond that is an event the consumer lost between fetch
and agent; faust would then commit past it (its own gap check treats the committed offset as the
last processed one). The agent exits instead of acking such a batch, so the restart reads again
from the committed offset. Pure logic; streams/shell.py is the I/O shell.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

Position = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True)
class OffsetGap:
    """Offsets `expected` .. `got - 1` of `topic`[`partition`] were never delivered."""

    topic: str
    partition: int
    expected: int
    got: int

    def describe(self) -> str:
        missing = f"{self.expected}" if self.got - self.expected == 1 else f"{self.expected}..{self.got - 1}"
        return f"{self.topic}[{self.partition}] offsets {missing} (next delivered: {self.got})"


class OffsetContinuity:
    """Tracks, per partition and generation, the next offset a consumer must see."""

    def __init__(self) -> None:
        self._generation: int | None = None
        self._next: dict[Position, int] = {}

    def check(
        self,
        records: Iterable[tuple[int, str, int, int]],
        committed: Callable[[str, int], int | None],
    ) -> list[OffsetGap]:
        """`records`: (generation, topic, partition, offset) in delivery order.
        `committed(topic, partition)`: the group's committed offset, None when unknown."""
        gaps: list[OffsetGap] = []
        for generation, topic, partition, offset in records:
            if generation != self._generation:
                self._generation, self._next = generation, {}  # partitions may have moved
            position = (topic, partition)
            expected = self._next.get(position)
            if expected is None:
                expected = committed(topic, partition)
            if expected is not None and offset > expected:
                gaps.append(OffsetGap(topic, partition, expected, offset))
            self._next[position] = max(self._next.get(position, 0), offset + 1)
        return gaps

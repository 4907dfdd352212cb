"""The sink contract (Quix-style): `add` rows, `flush` them durably, `close`.

A sink buffers rows with the record they came from (`schemas.records.Record`), so that rows it cannot write
are handed back as `Rejected` (for the dead-letter topic) instead of being dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.records import Record


@dataclass(frozen=True)
class Rejected:
    """A row the destination refused, why, and where it came from."""

    table: str
    source: Record
    reason: str
    error_type: str


class Sink:
    """Base class: subclasses write buffered rows to one destination."""

    def add(self, table: str, row: tuple, source: Record) -> None:
        raise NotImplementedError

    def flush(self) -> list[Rejected]:
        """Write every buffered row; return the rows that can never be written. Raises when the
        destination is unavailable for longer than the sink is willing to retry."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the destination (does not flush)."""

    @property
    def pending(self) -> int:
        """Rows buffered and not yet flushed."""
        raise NotImplementedError

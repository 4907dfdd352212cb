"""Exception roots. `AgentstreamError` is the project-wide root; each package derives its own.

Messages name the field and the value received, so a user can fix the input without reading code.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass


class AgentstreamError(Exception):
    """Root of every error agentstream raises on purpose. The CLI prints these as one line."""


@dataclass(frozen=True)
class FieldError:
    """One problem with one field of one input: what a gateway returns per field."""

    field: str
    value: object
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message} (got {_short_repr(self.value)})"


class SchemaError(AgentstreamError):
    """Root for the `schemas` package."""


class DecodeError(SchemaError):
    """Bytes or a mapping that is not a valid event. `errors` lists every field problem found."""

    def __init__(self, errors: list[FieldError], event_type: str | None = None):
        self.errors = errors
        self.event_type = event_type
        where = f"{event_type}: " if event_type else ""
        super().__init__(where + "; ".join(str(e) for e in errors))

    @property
    def reason(self) -> str:
        return str(self)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 4, 60, 60


def _short_repr(value: object, limit: int = 80) -> str:
    """The value, abbreviated: `reprlib` stops at a few levels and items, so a value nested
    thousands of levels deep or megabytes long costs little and never a RecursionError."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

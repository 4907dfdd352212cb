"""The engine's error: `EngineError`, with messages that name the path or the field."""

from __future__ import annotations

from producers.errors import ProducerError


class EngineError(ProducerError):
    """A base model or adapter that cannot be loaded (the message names the path), or a bad request."""


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"

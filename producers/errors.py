"""Exceptions of the `producers` package. `ProducerError` is the root (an `AgentstreamError`)."""

from __future__ import annotations

from schemas.errors import AgentstreamError


class ProducerError(AgentstreamError):
    """Root for everything the SDK, the spool and the gateway raise on purpose."""


class RecorderBufferFull(ProducerError):
    """The recorder's in-memory buffer is full and its `on_full` policy gave up."""

    def __init__(self, capacity: int, waited_s: float | None = None):
        self.capacity = capacity
        self.waited_s = waited_s
        waited = f" after waiting {waited_s:.3g}s" if waited_s is not None else ""
        super().__init__(
            f"recorder buffer full: buffer_size={capacity} events are waiting to be spooled{waited}; "
            "raise buffer_size, use on_full='block' with a longer block_timeout_s, or record less often"
        )


class RecorderClosed(ProducerError):
    """An event was recorded after `close()`."""


class EpisodeStateError(ProducerError):
    """An episode was used out of order (a step after `end()`, `end()` twice)."""


class SpoolError(ProducerError):
    """The local spool is unusable (locked by another process, or corrupt beyond its torn tail)."""

"""The trainer package's exception root."""

from __future__ import annotations

from schemas.errors import AgentstreamError


class TrainerError(AgentstreamError):
    """Root of the errors the trainer consumer and executor raise on purpose."""

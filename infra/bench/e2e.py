"""`agentstream bench e2e` (not implemented yet; the owning issue replaces this stub)."""

from __future__ import annotations

from schemas.errors import AgentstreamError


def add_arguments(parser) -> None:
    """Options of this benchmark."""


def run(args) -> dict:
    raise AgentstreamError("agentstream bench e2e is not implemented yet")

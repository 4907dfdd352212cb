"""`agentstream export` (being built; registers nothing yet)."""

from __future__ import annotations


def register(sub) -> None:
    """Add this module's subcommands to the `agentstream` parser."""

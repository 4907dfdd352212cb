"""Subcommands contributed by this package (see infra/cli.py). Handlers are imported lazily."""

from __future__ import annotations


def register(sub) -> None:
    """Add this package's subcommands to the `agentstream` parser."""

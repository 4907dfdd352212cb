"""The gateway's OTLP/HTTP endpoint (being built; adds no route yet)."""

from __future__ import annotations


def add_otlp_routes(app) -> None:
    """Add `POST /v1/traces` to the gateway's aiohttp application."""

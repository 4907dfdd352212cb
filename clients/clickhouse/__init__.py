"""ClickHouse for agentstream: connection by URL (chDB embedded or a server), migrations, analytics."""

from __future__ import annotations

from schemas.errors import AgentstreamError

DATABASE = "agentstream"


class ClickHouseError(AgentstreamError):
    """A ClickHouse URL, migration or query problem a user can fix."""

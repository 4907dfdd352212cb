"""The MCP server's one exception (its root sits under `infra.errors.InfraError`).

    AgentstreamError (schemas.errors)
    └── InfraError (infra.errors)
        └── McpToolError    a tool refused its input or could not reach what it needs

The wiring (`infra.mcp.server`) turns it, and every other `AgentstreamError` a tool's layer raises,
into the MCP tool error the client sees: one line naming the argument and the value received.
"""

from __future__ import annotations

from infra.errors import InfraError


class McpToolError(InfraError):
    """A tool call that cannot be served as asked: the message names the argument and the value."""

"""`agentstream mcp`'s configuration: documented fields are its command-line options."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from infra.mcp.errors import McpToolError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class McpConfig:
    """Where the server listens and the limits its tools run under.

    The MCP HTTP transport has no authentication, so `--host` must be a loopback address."""

    clickhouse_url: str = ""
    bootstrap_servers: str = ""
    data_dir: Path = Path(".agentstream")
    transport: Literal["stdio", "http"] = field(
        default="stdio",
        metadata={
            "env": "AGENTSTREAM_MCP_TRANSPORT",
            "help": "stdio (an MCP client starts the server) or streamable HTTP",
        },
    )
    host: str = field(
        default="127.0.0.1",
        metadata={"env": "AGENTSTREAM_MCP_HOST", "help": "HTTP transport: loopback address to bind"},
    )
    port: int = field(
        default=8765,
        metadata={"env": "AGENTSTREAM_MCP_PORT", "help": "HTTP transport: port to bind (0: any free port)"},
    )
    sql_max_rows: int = field(
        default=1000,
        metadata={
            "env": "AGENTSTREAM_MCP_SQL_MAX_ROWS",
            "help": "the sql tool returns at most this many rows",
        },
    )
    sql_timeout_s: float = field(
        default=30.0,
        metadata={
            "env": "AGENTSTREAM_MCP_SQL_TIMEOUT_S",
            "help": "the sql tool gives up on a query after this",
        },
    )
    read_timeout_s: float = field(
        default=30.0,
        metadata={
            "env": "AGENTSTREAM_MCP_READ_TIMEOUT_S",
            "help": "seconds to read the topics (calibration_report from topics)",
        },
    )

    def __post_init__(self):
        if self.host not in LOOPBACK:
            raise McpToolError(
                f"host={self.host!r}: the MCP HTTP transport has no authentication; bind a loopback "
                f"address ({', '.join(LOOPBACK)})"
            )
        if not 0 <= self.port <= 65535:
            raise McpToolError(f"port={self.port!r}: must be from 0 to 65535")
        if self.sql_max_rows < 1:
            raise McpToolError(f"sql_max_rows={self.sql_max_rows!r}: must be >= 1")
        if self.sql_timeout_s <= 0:
            raise McpToolError(f"sql_timeout_s={self.sql_timeout_s!r}: must be positive")

"""`agentstream mcp`'s configuration: documented fields are its command-line options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from infra.mcp.errors import McpToolError
from schemas.config_fields import option

LOOPBACK = ("127.0.0.1", "localhost", "::1")
DEFAULT_POLICY_URL = "http://127.0.0.1:8000/v1"  # `agentstream policy` / `up --policy` defaults


@dataclass(frozen=True)
class McpConfig:
    """Where the server listens and the limits its tools run under.

    The MCP HTTP transport has no authentication, so `--host` must be a loopback address."""

    clickhouse_url: str = ""
    bootstrap_servers: str = ""
    data_dir: Path = Path(".agentstream")
    transport: Literal["stdio", "http"] = option(
        "stdio", "stdio (an MCP client starts the server) or streamable HTTP", env="AGENTSTREAM_MCP_TRANSPORT"
    )
    host: str = option("127.0.0.1", "HTTP transport: loopback address to bind", env="AGENTSTREAM_MCP_HOST")
    port: int = option(8765, "HTTP transport: port to bind (0: any free port)", env="AGENTSTREAM_MCP_PORT")
    sql_max_rows: int = option(
        1000, "the sql tool returns at most this many rows", env="AGENTSTREAM_MCP_SQL_MAX_ROWS"
    )
    sql_timeout_s: float = option(
        30.0, "the sql tool gives up on a query after this", env="AGENTSTREAM_MCP_SQL_TIMEOUT_S"
    )
    policy_urls: tuple[str, ...] = option(
        (DEFAULT_POLICY_URL,),
        "the policy endpoints the rollout tool may call (comma-separated OpenAI base URLs); the "
        "stack's own policy server (<data dir>/run/policy.ready) is always allowed",
        env="AGENTSTREAM_MCP_POLICY_URLS",
    )
    read_timeout_s: float = option(
        30.0,
        "seconds to read the topics (calibration_report from topics)",
        env="AGENTSTREAM_MCP_READ_TIMEOUT_S",
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
        for url in self.policy_urls:
            policy_endpoint(url, "policy_urls")
        if self.sql_timeout_s <= 0:
            raise McpToolError(f"sql_timeout_s={self.sql_timeout_s!r}: must be positive")


def policy_endpoint(url: str, name: str = "policy_url") -> str:
    """`url` in the one form allow-list entries are compared in (scheme and host lower-case, the
    port explicit, no trailing slash); refuses what is not a plain http(s) base URL.

    >>> policy_endpoint("HTTP://LocalHost:8000/v1/"), policy_endpoint("http://[::1]/v1")
    ('http://localhost:8000/v1', 'http://[::1]:80/v1')
    """
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url.strip())
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    except ValueError:
        raise McpToolError(f"{name}={url!r}: not a URL") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        raise McpToolError(f"{name}={url!r}: must be an http(s) URL such as {DEFAULT_POLICY_URL}")
    if parts.query or parts.fragment:
        raise McpToolError(f"{name}={url!r}: a base URL has no query or fragment")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{scheme}://{host.lower()}:{port}{parts.path.rstrip('/')}"

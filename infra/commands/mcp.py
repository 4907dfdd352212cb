"""`agentstream mcp`: the MCP server (infra/mcp/), options generated from `McpConfig`.

Over stdio (the default) stdout carries the protocol alone: the one line for a person goes to
stderr, and logging is on stderr as everywhere.
"""

from __future__ import annotations

from infra.mcp.config import McpConfig
from infra.options.configs import config_command, config_from_settings
from infra.options.env import add_option
from infra.terminal import output


def register(sub) -> None:
    """Add `mcp` to the `agentstream` parser."""
    summary = "MCP server: SQL, leaderboard, trajectories, rewards, labels, environments"
    parser = config_command(sub, "mcp", run_mcp, summary, McpConfig)
    add_option(parser, "--ready-file", help="HTTP transport: write host:port here once listening")


def run_mcp(args) -> int:
    from infra.mcp.server import serve

    serve(config_from_settings(McpConfig, args), args.ready_file, on_listening=_announce)
    return 0


def _announce(url: str) -> None:
    output.warn(f"MCP server (streamable HTTP) at {url}; Ctrl-C stops")

"""`agentstream mcp`: the MCP server (infra/mcp/), options generated from `McpConfig`.

Over stdio (the default) stdout carries the protocol alone: the one line for a person goes to
stderr, and logging is on stderr as everywhere.
"""

from __future__ import annotations

from infra.mcp.config import McpConfig
from infra.options.configs import add_config_options, config_from_args
from infra.options.env import add_option, command_parser
from infra.terminal import output


def register(sub) -> None:
    """Add `mcp` to the `agentstream` parser."""
    parser = command_parser(
        sub, "mcp", run_mcp, "MCP server: SQL, leaderboard, trajectories, rewards, labels, environments"
    )
    add_config_options(parser, McpConfig)
    add_option(parser, "--ready-file", help="HTTP transport: write host:port here once listening")


def run_mcp(args) -> int:
    from infra.mcp.server import serve
    from schemas.settings import Settings

    settings = Settings.from_args(args)
    config = config_from_args(
        McpConfig,
        args,
        clickhouse_url=settings.resolved_clickhouse_url,
        bootstrap_servers=settings.bootstrap_servers,
        data_dir=settings.data_dir,
    )
    serve(config, args.ready_file, on_listening=_announce)
    return 0


def _announce(url: str) -> None:
    output.warn(f"MCP server (streamable HTTP) at {url}; Ctrl-C stops")

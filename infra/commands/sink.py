"""Subcommands contributed by this package (see infra/cli/main.py). Handlers are imported lazily.

- `agentstream sink`: the ClickHouse sink worker (consumers/sink/runner.py).
"""

from __future__ import annotations

from consumers.sink.cli_main import run
from infra.cli.options import add_option, command_parser


def register(sub) -> None:
    """Add this package's subcommands to the `agentstream` parser."""
    parser = command_parser(sub, "sink", run, "consume every topic into ClickHouse (migrates on start)")
    add_option(parser, "--group-id", default="agentstream-sink", help="Kafka consumer group of the sink")
    add_option(parser, "--batch-rows", type=int, default=5000, help="flush after this many buffered rows")
    add_option(
        parser, "--flush-interval-s", type=float, default=0.5, help="flush at least this often (seconds)"
    )
    add_option(
        parser,
        "--max-retry-s",
        type=float,
        default=300.0,
        help="retry an unavailable ClickHouse this long, then exit 1",
    )
    add_option(
        parser,
        "--from-beginning",
        action="store_true",
        default=False,
        help="rewind the group to offset 0 first (replay)",
    )
    add_option(
        parser,
        "--endpoint-port",
        type=int,
        default=0,
        help="port of the HTTP endpoint serving an embedded chDB path",
    )
    add_option(parser, "--ready-file", help="write the ClickHouse URL readers should use once consuming")

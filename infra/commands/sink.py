"""`agentstream sink`: consume every topic into ClickHouse (argument plumbing only).

Its options are generated from `consumers.sink.runner.SinkConfig`: adding a sink option is adding a
documented field there. The work happens in `consumers.sink.runner.run_until_signalled`.
"""

from __future__ import annotations

import argparse

from consumers.sink.runner import SinkConfig
from infra.options.configs import add_config_options, config_from_args
from infra.options.env import command_parser
from schemas.settings import Settings


def register(sub) -> None:
    """Add `sink` to the `agentstream` parser."""
    parser = command_parser(sub, "sink", run, "consume every topic into ClickHouse (migrates on start)")
    add_config_options(parser, SinkConfig)


def run(args: argparse.Namespace) -> int:
    from consumers.sink.runner import run_until_signalled

    settings = Settings.from_args(args)
    config = config_from_args(
        SinkConfig,
        args,
        bootstrap_servers=settings.bootstrap_servers,
        clickhouse_url=settings.resolved_clickhouse_url,
    )
    run_until_signalled(config)
    return 0

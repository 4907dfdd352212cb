"""`agentstream sink`: consume every topic into ClickHouse (argument plumbing only).

Its options are generated from `consumers.sink.runner.SinkConfig`: adding a sink option is adding a
documented field there. The work happens in `consumers.sink.runner.run_until_signalled`.
"""

from __future__ import annotations

import argparse

from consumers.sink.runner import SinkConfig
from infra.options.configs import config_command, config_from_settings


def register(sub) -> None:
    """Add `sink` to the `agentstream` parser."""
    config_command(sub, "sink", run, "consume every topic into ClickHouse (migrates on start)", SinkConfig)


def run(args: argparse.Namespace) -> int:
    from consumers.sink.runner import run_until_signalled

    run_until_signalled(config_from_settings(SinkConfig, args))
    return 0

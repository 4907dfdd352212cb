"""`agentstream broker`: run the embedded Kafka-protocol broker (its lifecycle is
infra/broker/runner.py) until SIGTERM/SIGINT; its options are generated from
`infra.broker.state.BrokerConfig`. The broker package knows nothing of this command line.
"""

from __future__ import annotations

from pathlib import Path

from infra.broker.state import BrokerConfig
from infra.options.configs import add_config_options, config_from_args
from infra.options.env import add_option, command_parser


def register(sub) -> None:
    """Add `agentstream broker` to the parser."""
    parser = command_parser(
        sub,
        "broker",
        run,
        "run the embedded Kafka-protocol broker (durable, single node)",
    )
    add_config_options(parser, BrokerConfig)
    add_option(
        parser, "--ready-file", help='write "host:port" to this file once the broker accepts connections'
    )


def broker_config(args) -> BrokerConfig:
    """A `BrokerConfig` from parsed `agentstream broker` options (generated from its fields)."""
    from infra.broker.runner import broker_dir
    from schemas.settings import Settings

    return config_from_args(BrokerConfig, args, data_dir=broker_dir(Settings.from_args(args).data_dir))


def run(args) -> int:
    """Serve until a signal arrives."""
    import asyncio

    from infra.broker.runner import serve

    ready_file = Path(args.ready_file) if args.ready_file else None
    asyncio.run(serve(broker_config(args), ready_file=ready_file))
    return 0

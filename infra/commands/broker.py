"""Subcommands contributed by this package (see infra/cli/main.py). Handlers are imported lazily.

- `agentstream broker`: run the embedded Kafka-protocol broker (infra/broker/runner.py); its options
  are generated from `infra.broker.state.BrokerConfig`.
- `agentstream topics create|list|describe`: topic administration through kafka-python's admin
  client, so they work against the embedded broker and any Apache Kafka alike.
"""

from __future__ import annotations

from infra.broker import topics_cli
from infra.broker.runner import run
from infra.broker.state import BrokerConfig
from infra.cli.configs import add_config_options
from infra.cli.options import add_option, command_parser, group_parser


def register(sub) -> None:
    """Add this package's subcommands to the `agentstream` parser."""
    _register_broker(sub)
    _register_topics(sub)


def _register_broker(sub) -> None:
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


def _register_topics(sub) -> None:
    topics = group_parser(sub, "topics", "create, list and describe Kafka topics (any Kafka)")
    create = command_parser(
        topics,
        "create",
        topics_cli.create,
        "create topics (no names: every topic of the agentstream registry)",
    )
    create.add_argument("names", nargs="*", help="topic names (default: the whole registry)")
    add_option(create, "--partitions", type=int, default=1, help="partitions for named topics")
    create.add_argument(
        "--config", action="append", default=[], metavar="KEY=VALUE", help="topic config for named topics"
    )
    command_parser(topics, "list", topics_cli.list_topics, "list topic names")
    describe = command_parser(
        topics, "describe", topics_cli.describe, "show partitions and configs of topics"
    )
    describe.add_argument("names", nargs="*", help="topic names (default: every topic)")

"""Subcommands contributed by this package (see infra/cli/main.py). Handlers are imported lazily.

- `agentstream broker`: run the embedded Kafka-protocol broker (infra/broker/runner.py).
- `agentstream topics create|list|describe`: topic administration through kafka-python's admin
  client, so they work against the embedded broker and any Apache Kafka alike.
"""

from __future__ import annotations

from infra.broker import topics_cli
from infra.broker.runner import run
from infra.cli.options import add_option, command_parser, group_parser
from schemas.settings import DEFAULT_BROKER_HOST, DEFAULT_BROKER_PORT


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
    add_option(
        parser, "--host", default=DEFAULT_BROKER_HOST, env="AGENTSTREAM_BROKER_HOST", help="address to bind"
    )
    add_option(
        parser,
        "--port",
        type=int,
        default=DEFAULT_BROKER_PORT,
        env="AGENTSTREAM_BROKER_PORT",
        help="port to listen on (0: a free port, see --ready-file)",
    )
    add_option(
        parser, "--ready-file", help='write "host:port" to this file once the broker accepts connections'
    )
    add_option(
        parser,
        "--flush",
        choices=["always", "interval"],
        default="always",
        help="always: fsync before acknowledging a produce; interval: fsync every --flush-interval-ms",
    )
    add_option(
        parser, "--flush-interval-ms", type=int, default=1000, help="fsync period with --flush interval"
    )
    add_option(parser, "--default-partitions", type=int, default=1, help="partitions of auto-created topics")
    add_option(
        parser,
        "--auto-create-topics",
        action="store_true",
        default=True,
        help="create unknown topics on a Metadata request that allows it",
    )
    add_option(
        parser,
        "--max-request-bytes",
        type=int,
        default=100 * 1024 * 1024,
        help="largest request frame accepted; larger frames close the connection",
    )
    add_option(
        parser,
        "--retention-check-interval-ms",
        type=int,
        default=5000,
        help="how often old segments are checked against retention.ms / retention.bytes",
    )
    add_option(
        parser,
        "--initial-rebalance-delay-ms",
        type=int,
        default=100,
        help="how long an empty group waits for more members before its first rebalance",
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

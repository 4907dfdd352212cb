"""`agentstream topics create|list|describe`: topic administration with kafka-python's admin client.

Talks only the Kafka protocol, so the commands work against the embedded broker and any Apache
Kafka. Output is plain text for people; errors raise `TopicAdminError` (one line, exit 1).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from infra.errors import InfraError
from infra.options.env import add_option, command_parser, group_parser
from infra.terminal import output
from schemas.settings import Settings

log = logging.getLogger(__name__)


class TopicAdminError(InfraError):
    """A topic command that the cluster refused or could not reach."""


def register(sub) -> None:
    """Add `agentstream topics create|list|describe` to the parser."""
    topics = group_parser(sub, "topics", "create, list and describe Kafka topics (any Kafka)")
    create_parser = command_parser(
        topics,
        "create",
        create,
        "create topics (no names: every topic of the agentstream registry)",
    )
    create_parser.add_argument("names", nargs="*", help="topic names (default: the whole registry)")
    add_option(create_parser, "--partitions", type=int, default=1, help="partitions for named topics")
    create_parser.add_argument(
        "--config", action="append", default=[], metavar="KEY=VALUE", help="topic config for named topics"
    )
    command_parser(topics, "list", list_topics, "list topic names")
    describe_parser = command_parser(topics, "describe", describe, "show partitions and configs of topics")
    describe_parser.add_argument("names", nargs="*", help="topic names (default: every topic)")


@contextmanager
def _admin(args) -> Iterator:
    """The factory's admin client on the configured cluster for the block, closed after."""
    from kafka.errors import KafkaError

    from clients.kafka import make_admin

    bootstrap = Settings.from_args(args).bootstrap_servers
    try:
        admin = make_admin(bootstrap, "agentstream-topics")
    except KafkaError as exc:
        raise TopicAdminError(f"bootstrap_servers={bootstrap!r}: cannot reach Kafka ({exc})") from exc
    try:
        yield admin
    finally:
        admin.close()


def parse_configs(pairs: list[str]) -> dict[str, str]:
    """["k=v", ...] -> {"k": "v"}.

    >>> parse_configs(["retention.ms=1000", "cleanup.policy=compact"])
    {'retention.ms': '1000', 'cleanup.policy': 'compact'}
    """
    configs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise TopicAdminError(f"--config: expected KEY=VALUE, got {pair!r}")
        configs[key] = value
    return configs


def create(args) -> int:
    if not args.names:
        from clients.kafka import ensure_topics

        created = ensure_topics(Settings.from_args(args).bootstrap_servers)
        output.say(
            f"created {len(created)} registry topic(s)" + (": " + ", ".join(created) if created else "")
        )
        return 0
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    configs = parse_configs(args.config)
    with _admin(args) as admin:
        for name in args.names:
            try:
                admin.create_topics([NewTopic(name, args.partitions, 1, topic_configs=configs)])
                output.say(f"created {name} ({args.partitions} partition(s))")
            except TopicAlreadyExistsError:
                output.say(f"exists  {name}")
    return 0


def list_topics(args) -> int:
    with _admin(args) as admin:
        for name in sorted(admin.list_topics()):
            output.say(name)
    return 0


def describe(args) -> int:
    from kafka.admin import ConfigResource, ConfigResourceType

    with _admin(args) as admin:
        names = args.names or sorted(admin.list_topics())
        described = {t["name"]: t for t in admin.describe_topics(names)}
        for name in names:
            topic = described.get(name)
            if topic is None or topic.get("error_code"):
                raise TopicAdminError(f"topic {name!r}: not found")
            resource = ConfigResource(ConfigResourceType.TOPIC, name)
            configs = admin.describe_configs([resource], config_filter="all").get("topic", {}).get(name, {})
            output.say(f"{name}  partitions={len(topic['partitions'])}")
            for key in sorted(configs):
                source = configs[key].get("config_source", "")
                marker = "" if source == "DEFAULT_CONFIG" else "  (override)"
                output.say(f"    {key}={configs[key]['value']}{marker}")
    return 0

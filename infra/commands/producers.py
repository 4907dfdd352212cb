"""Subcommands of the producers package: `agentstream gateway` and `agentstream spool status|flush`.

Handlers are imported lazily (infra/cli.py); this module only declares options.
"""

from __future__ import annotations

from infra.cli.options import add_option, command_parser, group_parser


def register(sub) -> None:
    """Add this package's subcommands to the `agentstream` parser."""
    gateway = command_parser(sub, "gateway", run_gateway, "HTTP ingestion: POST /v1/events")
    add_option(gateway, "--host", default="127.0.0.1", help="address to bind")
    add_option(gateway, "--port", type=int, default=8080, help="port to bind (0: any free port)")
    add_option(
        gateway,
        "--api-key-hashes",
        env="AGENTSTREAM_GATEWAY_API_KEY_HASHES",
        help="comma-separated sha256 hex digests of the accepted API keys (`agentstream gateway-key KEY`)",
    )
    add_option(
        gateway, "--allow-anonymous", action="store_true", default=False, help="accept requests without a key"
    )
    add_option(
        gateway, "--max-body-bytes", type=int, default=4 * 1024 * 1024, help="request size limit (413 above)"
    )
    add_option(gateway, "--max-events", type=int, default=10_000, help="events per request limit (413 above)")
    add_option(
        gateway,
        "--ack-timeout-s",
        type=float,
        default=30.0,
        help="wait this long for broker acks (503 after)",
    )
    add_option(gateway, "--client", default="kafka-python", help="Kafka client: kafka-python or aiokafka")
    add_option(gateway, "--ready-file", help="write host:port here once listening")

    key = command_parser(sub, "gateway-key", run_gateway_key, "print the sha256 hash of an API key")
    key.add_argument("key", help="the API key to hash (give the hash to --api-key-hashes)")

    spool = group_parser(sub, "spool", "the SDK's local spool of undelivered events")
    command_parser(spool, "status", run_spool_status, "list spool slots and undelivered events")
    flush = command_parser(spool, "flush", run_spool_flush, "deliver every spooled event now")
    add_option(flush, "--timeout-s", type=float, default=60.0, help="give up after this many seconds")


def run_gateway(args) -> int:
    import asyncio

    from producers.gateway import GatewayConfig, parse_key_hashes, serve
    from schemas.settings import Settings

    settings = Settings.from_args(args)
    config = GatewayConfig(
        bootstrap_servers=settings.bootstrap_servers,
        api_key_hashes=parse_key_hashes(args.api_key_hashes),
        allow_anonymous=bool(args.allow_anonymous),
        max_body_bytes=args.max_body_bytes,
        max_events=args.max_events,
        ack_timeout_s=args.ack_timeout_s,
        client=args.client,
    )
    try:
        asyncio.run(serve(config, args.host, args.port, args.ready_file))
    except KeyboardInterrupt:
        return 0
    return 0


def run_gateway_key(args) -> int:
    from producers.gateway import hash_key

    print(hash_key(args.key))
    return 0


def run_spool_status(args) -> int:
    from producers.spool import slot_status
    from schemas.settings import Settings

    root = Settings.from_args(args).data_dir / "spool"
    if not root.exists():
        print(f"no spool under {root}")
        return 0
    for row in slot_status(root):
        state = "in use by a running recorder" if row["in_use"] else f"{row['pending']} undelivered events"
        print(f"{root / row['slot']}: {state}")
    return 0


def run_spool_flush(args) -> int:
    from producers.delivery import DeliveryConfig, SpoolDelivery
    from producers.errors import ProducerError
    from producers.spool import Spool, SpoolLocked
    from schemas.settings import Settings

    settings = Settings.from_args(args)
    root = settings.data_dir / "spool"
    slots = sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []
    left = 0
    for path in slots:
        try:
            spool = Spool(path)
        except SpoolLocked:
            print(f"{path}: skipped (a running recorder owns it and delivers it)")
            continue
        try:
            before = spool.pending
            delivery = SpoolDelivery(
                spool, DeliveryConfig(settings.bootstrap_servers, client_id="agentstream-spool")
            )
            done = delivery.drain(args.timeout_s)
            delivery.close()
            print(f"{path}: delivered {before - spool.pending}, {spool.pending} left")
            left += 0 if done else spool.pending
        finally:
            spool.close()
    if left:
        raise ProducerError(
            f"{left} events could not be delivered to {settings.bootstrap_servers}; they stay spooled"
        )
    return 0

"""Subcommands of the producers package: `agentstream gateway`, `gateway-key` and `spool status|flush`.

The gateway's options are generated from `producers.gateway.requests.GatewayConfig` (plus where to
listen); handlers import the producers modules they run when they run.
"""

from __future__ import annotations

from infra.options.configs import add_config_options, config_from_args
from infra.options.env import add_option, command_parser, group_parser
from infra.terminal import output
from producers.gateway.requests import GatewayConfig


def register(sub) -> None:
    """Add this package's subcommands to the `agentstream` parser."""
    gateway = command_parser(sub, "gateway", run_gateway, "HTTP ingestion: POST /v1/events")
    add_option(gateway, "--host", default="127.0.0.1", help="address to bind")
    add_option(gateway, "--port", type=int, default=8080, help="port to bind (0: any free port)")
    add_config_options(gateway, GatewayConfig)
    add_option(gateway, "--ready-file", help="write host:port here once listening")

    key = command_parser(sub, "gateway-key", run_gateway_key, "print the sha256 hash of an API key")
    key.add_argument("key", help="the API key to hash (give the hash to --api-key-hashes)")

    spool = group_parser(sub, "spool", "the SDK's local spool of undelivered events")
    command_parser(spool, "status", run_spool_status, "list spool slots and undelivered events")
    flush = command_parser(spool, "flush", run_spool_flush, "deliver every spooled event now")
    add_option(flush, "--timeout-s", type=float, default=60.0, help="give up after this many seconds")


def run_gateway(args) -> int:
    import asyncio

    from producers.gateway.server import serve
    from producers.redaction_settings import settings_file
    from schemas.settings import Settings

    settings = Settings.from_args(args)
    found = settings_file(getattr(args, "settings_file", None), settings.data_dir)  # --data-dir counts too
    config = config_from_args(
        GatewayConfig,
        args,
        bootstrap_servers=settings.bootstrap_servers,
        settings_file=str(found) if found else None,
        otlp_cursor_path=args.otlp_cursor_path or str(settings.data_dir / "gateway" / "otlp-cursor.sqlite"),
    )
    try:
        asyncio.run(serve(config, args.host, args.port, args.ready_file))
    except KeyboardInterrupt:
        return 0
    return 0


def run_gateway_key(args) -> int:
    from producers.gateway.requests import hash_key

    output.say(hash_key(args.key))
    return 0


def run_spool_status(args) -> int:
    from producers.sdk.spool import slot_status
    from schemas.settings import Settings

    root = Settings.from_args(args).data_dir / "spool"
    if not root.exists():
        output.say(f"no spool under {root}")
        return 0
    for row in slot_status(root):
        state = "in use by a running recorder" if row["in_use"] else f"{row['pending']} undelivered events"
        output.say(f"{root / row['slot']}: {state}")
    return 0


def run_spool_flush(args) -> int:
    from producers.errors import ProducerError, SpoolLocked
    from producers.sdk.delivery import DeliveryConfig, SpoolDelivery
    from producers.sdk.spool import Spool
    from schemas.settings import Settings

    settings = Settings.from_args(args)
    root = settings.data_dir / "spool"
    slots = sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []
    left = 0
    for path in slots:
        try:
            spool = Spool(path)
        except SpoolLocked:
            output.say(f"{path}: skipped (a running recorder owns it and delivers it)")
            continue
        try:
            before = spool.pending
            delivery = SpoolDelivery(
                spool, DeliveryConfig(settings.bootstrap_servers, client_id="agentstream-spool")
            )
            done = delivery.drain(args.timeout_s)
            delivery.close()
            output.say(f"{path}: delivered {before - spool.pending}, {spool.pending} left")
            left += 0 if done else spool.pending
        finally:
            spool.close()
    if left:
        raise ProducerError(
            f"{left} events could not be delivered to {settings.bootstrap_servers}; they stay spooled"
        )
    return 0

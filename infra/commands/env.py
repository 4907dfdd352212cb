"""`agentstream env serve NAME`: a registered environment over HTTP, a session per episode
(producers/envs/service/, protocol in docs/environment-protocol.md); `agentstream rollout --env-url`
uses it. Options are generated from `EnvServiceConfig`."""

from __future__ import annotations

from infra.options.configs import add_config_options, config_from_args
from infra.options.env import add_option, command_parser, group_parser
from infra.terminal import output
from producers.envs.service.config import EnvServiceConfig


def register(sub) -> None:
    """Add `env serve` to the `agentstream` parser."""
    env = group_parser(sub, "env", "environments as services")
    parser = command_parser(
        env, "serve", run_serve, "serve a registered environment over HTTP, one session per episode"
    )
    parser.add_argument("name", metavar="NAME", help="the environment id (calc, sandbox, conversation, ...)")
    add_option(
        parser,
        "--host",
        env="AGENTSTREAM_ENV_HOST",
        default="127.0.0.1",
        help="address to bind (off loopback: API keys needed)",
    )
    add_option(
        parser,
        "--port",
        env="AGENTSTREAM_ENV_PORT",
        type=int,
        default=0,
        help="port to bind (0: any free port)",
    )
    add_config_options(parser, EnvServiceConfig)
    add_option(parser, "--ready-file", help="write host:port here once listening")


def run_serve(args) -> int:
    import asyncio

    import producers.envs  # noqa: F401  (registers the built-in environments)
    from producers.envs.service.server import serve

    config = config_from_args(EnvServiceConfig, args)

    def announce(address: str) -> None:
        host, _, port = address.rpartition(":")
        host = f"[{host}]" if ":" in host else host
        output.say(f"[env] serving {args.name} at http://{host}:{port} (rollout --env-url); Ctrl-C stops")

    try:
        asyncio.run(serve(args.name, config, args.host, args.port, args.ready_file, announce))
    except KeyboardInterrupt:
        pass
    return 0

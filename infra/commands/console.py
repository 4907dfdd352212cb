"""`agentstream console`: the read-only web console (options generated from ConsoleConfig)."""

from __future__ import annotations

from infra.console.config import ConsoleConfig
from infra.options.configs import config_command, config_from_settings
from infra.options.env import add_option
from infra.terminal import output


def register(sub) -> None:
    summary = "web console: stream, trajectories, leaderboard, training (read-only)"
    console = config_command(sub, "console", run_console, summary, ConsoleConfig)
    add_option(console, "--ready-file", help="write host:port here once listening")


def run_console(args) -> int:
    import asyncio
    import logging
    import signal

    from infra.console.app import serve

    # A broker that is down is reported on the overview page; kafka-python would log every retry.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    config = config_from_settings(ConsoleConfig, args)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(config, args.ready_file, stop, on_listening=_announce)

    asyncio.run(main())
    return 0


def _announce(url: str) -> None:
    output.say(f"console at {url} (read-only); Ctrl-C stops")

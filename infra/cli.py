"""The `agentstream` console script: one entry point, subcommands registered per package.

Each package contributes a `register(subparsers)` function in its own `cli` module. Handlers are
given as "module:function" strings and imported only when their command runs, so `agentstream
--help` never imports torch, faust, chdb or anthropic.

This module owns argument parsing, environment fallbacks and logging set-up; it does no work itself.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

# Modules that contribute subcommands. Each has `register(subparsers) -> None`.
COMMAND_MODULES = (
    "schemas.cli",
    "infra.broker.cli",
    "infra.clickhouse.cli",
    "infra.bench.cli",
    "infra.stack_cli",
    "producers.cli",
    "producers.adapters.cli",
    "streams.cli",
    "streams.judge.cli",
    "consumers.cli",
    "consumers.trainer.cli",
)

ENV_PREFIX = "AGENTSTREAM_"


class EnvDefault(argparse.Action):
    """An option whose default comes from an `AGENTSTREAM_*` environment variable.

    The variable is read when the command line is parsed (in `main`), never at import time.
    """

    def __init__(self, option_strings, dest, env: str | None = None, default=None, help=None, **kw):
        self.env = env or ENV_PREFIX + dest.upper()
        suffix = f"[env {self.env}" + (f"; default {default}]" if default not in (None, "") else "]")
        super().__init__(option_strings, dest, default=default, help=f"{help or ''} {suffix}".strip(), **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace._given = {*getattr(namespace, "_given", ()), self.dest}


def add_option(parser: argparse.ArgumentParser, *flags: str, env: str | None = None, **kw) -> None:
    """Add an option that falls back to an environment variable (named in its help)."""
    if kw.get("action") == "store_true":
        kw.pop("action")
        kw.setdefault("type", _parse_bool)
        kw.setdefault("nargs", "?")
        kw.setdefault("const", True)
    parser.add_argument(*flags, action=EnvDefault, env=env, **kw)


def _parse_bool(text: str) -> bool:
    lowered = str(text).strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """The settings every component honours (ARCHITECTURE.md, settings table)."""
    add_option(parser, "--bootstrap-servers", help="Kafka bootstrap address (host:port[,host:port])")
    add_option(parser, "--clickhouse-url", help="ClickHouse URL: chdb:///path (embedded) or http://host:8123")
    add_option(parser, "--data-dir", help="directory for local state (broker log, spool, chDB, batches)")
    add_option(parser, "--log-level", default="INFO", help="logging level")


def _apply_env_defaults(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fill every option the user did not give from its environment variable, if set."""
    for action in _all_actions(parser, args):
        if not isinstance(action, EnvDefault):
            continue
        if action.dest in getattr(args, "_given", ()):
            continue
        raw = os.environ.get(action.env)
        if raw is None:
            continue
        value = raw
        if action.type is not None:
            try:
                value = action.type(raw)
            except (ValueError, argparse.ArgumentTypeError) as exc:
                parser.error(f"{action.env}={raw!r}: {exc}")
        setattr(args, action.dest, value)


def _all_actions(parser: argparse.ArgumentParser, args: argparse.Namespace):
    yield from parser._actions
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name in _chosen_commands(args):
                    yield from _all_actions(sub, args)


def _chosen_commands(args: argparse.Namespace) -> set[str]:
    return {value for key, value in vars(args).items() if key.startswith("_command") and value}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentstream",
        description="agentstream: agent telemetry, online rewards and training data on Kafka + ClickHouse.",
        epilog="Every option falls back to the AGENTSTREAM_* environment variable named in its help.",
    )
    sub = parser.add_subparsers(dest="_command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(sub)
    return parser


def command_parser(sub, name: str, handler: str, help: str, common: bool = True) -> argparse.ArgumentParser:
    """Create a subcommand whose handler ("module:function") is imported only when it runs."""
    parser = sub.add_parser(name, help=help, description=help)
    if common:
        add_common_options(parser)
    parser.set_defaults(_handler=handler)
    return parser


def group_parser(sub, name: str, help: str):
    """Create a command with its own subcommands (e.g. `topics create`); returns their subparsers."""
    parser = sub.add_parser(name, help=help, description=help)
    return parser.add_subparsers(
        dest=f"_command_{name.replace('-', '_')}", metavar="SUBCOMMAND", required=True
    )


# Client libraries that narrate every connection at INFO; they speak up at WARNING unless asked (DEBUG).
_CHATTY_LOGGERS = ("kafka", "aiokafka", "faust", "mode", "urllib3", "httpx", "chdb")


def _configure_logging(level: str) -> None:
    numeric = getattr(logging, str(level).upper(), logging.INFO)
    logging.basicConfig(
        level=numeric, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    if numeric > logging.DEBUG:
        for name in _CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(max(numeric, logging.WARNING))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _apply_env_defaults(parser, args)
    handler = getattr(args, "_handler", None)
    if handler is None:
        parser.print_help()
        return 2
    _configure_logging(getattr(args, "log_level", "INFO") or "INFO")
    module_name, func_name = handler.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    try:
        result = func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from schemas.errors import AgentstreamError

        if isinstance(exc, AgentstreamError):
            print(f"agentstream: error: {exc}", file=sys.stderr)
            return 1
        raise
    return int(result or 0)


if __name__ == "__main__":
    # `python -m infra.cli` runs this file as __main__; the command modules import `infra.cli`, a
    # second copy with its own EnvDefault class. Run that copy so isinstance checks agree.
    from infra.cli import main as _main

    sys.exit(_main())

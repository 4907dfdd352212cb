"""The `agentstream` console script: one parser, built from the command modules in `infra/commands/`.

Each command module declares its subcommands with `register(subparsers)` and handles them with plain
functions referenced directly (no import strings): a typo fails when the parser is built. Handlers
import torch, faust, chdb or anthropic inside themselves, so `agentstream --help` stays fast.

This module owns parsing, environment fallbacks, logging set-up and the one-line error contract;
it does no work itself.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from infra.commands import (
    batch_train,
    bench,
    broker,
    clickhouse,
    console,
    env,
    evaluate,
    export,
    ingest,
    judge,
    lineage,
    mcp,
    policy,
    producers,
    replay,
    rollout,
    sandbox_engine,
    schema,
    sink,
    stack,
    topics,
    worker,
)
from infra.options.env import apply_env_defaults, renamed_notes
from infra.runtime import tune_gc
from infra.terminal import output
from schemas.errors import AgentstreamError

COMMAND_MODULES = (
    schema,
    broker,
    topics,
    clickhouse,
    lineage,
    bench,
    stack,
    producers,
    rollout,
    env,
    ingest,
    worker,
    judge,
    sink,
    batch_train,
    policy,
    evaluate,
    console,
    mcp,
    export,
    replay,
    sandbox_engine,
)

# Client libraries that narrate every connection at INFO; they speak up at WARNING unless asked (DEBUG).
_CHATTY_LOGGERS = ("kafka", "aiokafka", "faust", "mode", "urllib3", "httpx", "chdb")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentstream",
        description="agentstream: agent telemetry, online rewards and training data on Kafka + ClickHouse.",
        epilog="Every option falls back to the AGENTSTREAM_* environment variable named in its help.",
    )
    sub = parser.add_subparsers(dest="_command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def configure_logging(level: str) -> None:
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
    apply_env_defaults(parser, args)
    for note in renamed_notes(args):  # an old spelling used: one line each, on stderr
        output.warn(note)
    handler = getattr(args, "_handler", None)
    if handler is None:
        parser.print_help()
        return 2
    configure_logging(getattr(args, "log_level", "INFO") or "INFO")
    try:
        tune_gc()
        result = handler(args)
    except KeyboardInterrupt:
        return 130
    except AgentstreamError as exc:
        output.error(str(exc))
        return 1
    except OSError as exc:  # a path or a port the user named; the message names it
        output.error(f"{type(exc).__name__}: {exc}")
        return 1
    except Exception as exc:
        if not _is_kafka_error(exc):
            raise  # a bug: the traceback is what a report needs
        output.error(f"Kafka: {type(exc).__name__}: {exc} (check --bootstrap-servers)")
        return 1
    return int(result or 0)


def _is_kafka_error(exc: Exception) -> bool:
    module = type(exc).__module__
    return module.startswith(("kafka.", "aiokafka."))

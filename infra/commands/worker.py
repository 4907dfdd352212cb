"""Subcommands contributed by this package (see infra/cli/main.py). Handlers are imported lazily.

- `agentstream worker`: run stream processors (rule rewards, trajectory assembler, judge).
"""

from __future__ import annotations

from infra.cli.options import add_option, command_parser
from streams.worker import main


def register(sub) -> None:
    """Add this package's subcommands to the `agentstream` parser."""
    parser = command_parser(
        sub,
        "worker",
        main,
        "run stream processors (faust): rule rewards, trajectory assembly, LLM judge",
    )
    add_option(
        parser,
        "--roles",
        default="rules,assembler",
        help="comma-separated roles: rules, assembler, judge (one faust app and consumer group each)",
    )
    add_option(parser, "--profiles", help="JSON/YAML file with extra or overriding domain profiles")
    add_option(
        parser,
        "--judge-rules",
        env="AGENTSTREAM_JUDGE_RULES_PATH",
        help="judge rules file: trajectories it selects wait for judge scores in the assembler",
    )
    add_option(
        parser,
        "--grace-seconds",
        type=float,
        default=120.0,
        help="assembler: emit an incomplete trajectory after this long without new input",
    )
    add_option(parser, "--batch-max", type=int, default=10_000, help="events taken from the stream per batch")
    add_option(parser, "--batch-within", type=float, default=0.1, help="seconds to wait to fill a batch")
    add_option(parser, "--reward-version", default="rules-1", help="version stamped on rule rewards")

"""Options with environment fallbacks, and the helpers that declare commands.

Every option falls back to an `AGENTSTREAM_*` environment variable, named in its help and read when
the command line is parsed (`apply_env_defaults`), never at import time. Options of a config
dataclass are generated from its fields by `infra.options.configs`; this module holds the mechanics.

A renamed option keeps its old spelling for one release (`add_option(..., renamed_from="--old")`): the
old flag (hidden from help) and the old environment variable still work, and each use leaves a
one-line note in `renamed_notes(args)`, which the CLI prints on stderr (this floor prints nothing).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

ENV_PREFIX = "AGENTSTREAM_"


class EnvDefault(argparse.Action):
    """An option whose default comes from an `AGENTSTREAM_*` environment variable.

    The variable is read when the command line is parsed (in `main`), never at import time.
    """

    def __init__(
        self,
        option_strings,
        dest,
        env: str | None = None,
        old_env: str | None = None,
        default=None,
        help=None,
        **kw,
    ):
        self.env = env or ENV_PREFIX + dest.upper()
        self.old_env = old_env  # a renamed option's old variable, still read (with a note) for one release
        suffix = f"[env {self.env}" + (f"; default {default}]" if default not in (None, "") else "]")
        super().__init__(option_strings, dest, default=default, help=f"{help or ''} {suffix}".strip(), **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace._given = {*getattr(namespace, "_given", ()), self.dest}


def _note_renamed(namespace: argparse.Namespace, note: str) -> None:
    notes = getattr(namespace, "_renamed", [])
    if note not in notes:
        namespace._renamed = [*notes, note]


def renamed_notes(args: argparse.Namespace) -> list[str]:
    """One line per old spelling used on this command line or in the environment, to print on stderr."""
    return list(getattr(args, "_renamed", ()))


def renamed_note(old: str, new: str) -> str:
    """
    >>> renamed_note("--trainer", "--batch")
    'agentstream: --trainer is now --batch; the old name goes in the next release'
    """
    return f"agentstream: {old} is now {new}; the old name goes in the next release"


class EnvFlag(EnvDefault):
    """A boolean option: a flag pair `--x` / `--no-x` (argparse's BooleanOptionalAction) that takes
    no value, so `ingest --json PATH` reads PATH as the path; its environment variable says
    true/false/1/0/yes/no/on/off."""

    def __init__(self, option_strings, dest, env: str | None = None, default=None, help=None, **kw):
        pairs = [f for flag in option_strings for f in (flag, _negative(flag)) if f]
        super().__init__(pairs, dest, env=env, default=default, help=help, nargs=0, **kw)
        self.type = parse_bool  # for the environment variable only (nargs=0: argparse never calls it)

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, not option_string.startswith("--no-"), option_string)

    def format_usage(self) -> str:
        return " | ".join(self.option_strings)


class RenamedOption(argparse.Action):
    """The old spelling of an option, kept for one release and hidden from help: it does what the new
    one does (`--no-old` too, for a flag) and leaves a note (`renamed_notes`)."""

    def __init__(self, option_strings, dest, new: EnvDefault, **kw):
        self.new = new
        flag = isinstance(new, EnvFlag)
        pairs = [f for old in option_strings for f in (old, _negative(old) if flag else None) if f]
        if flag:
            kw["nargs"] = 0
        else:  # values are read as the new option reads them
            kw.update(type=new.type, choices=new.choices)
        super().__init__(pairs, dest, help=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        negative = option_string.startswith("--no-") and isinstance(self.new, EnvFlag)
        new = _negative(self.new.option_strings[0]) if negative else self.new.option_strings[0]
        _note_renamed(namespace, renamed_note(option_string, new))
        self.new(parser, namespace, values, new)


def _negative(flag: str) -> str | None:
    """`--x` -> `--no-x` (short flags have no negative)."""
    return "--no-" + flag[2:] if flag.startswith("--") else None


def add_option(
    parser: argparse.ArgumentParser,
    *flags: str,
    env: str | None = None,
    renamed_from: str | None = None,
    **kw,
) -> None:
    """Add an option that falls back to an environment variable (named in its help). A boolean one
    (`action="store_true"`) becomes a flag pair `--x` / `--no-x` (`EnvFlag`). `renamed_from`: its
    old spelling (`--old`), and with it `AGENTSTREAM_OLD`, still accepted for one release."""
    if renamed_from:
        kw["old_env"] = ENV_PREFIX + renamed_from.lstrip("-").replace("-", "_").upper()
    if kw.get("action") == "store_true":
        kw.pop("action")
        kw.setdefault("default", False)
        action = parser.add_argument(*flags, action=EnvFlag, env=env, **kw)
    else:
        action = parser.add_argument(*flags, action=EnvDefault, env=env, **kw)
    if renamed_from:
        parser.add_argument(renamed_from, action=RenamedOption, dest=action.dest, new=action)


def parse_bool(text: str) -> bool:
    """A boolean as an environment variable writes it.

    >>> parse_bool("true"), parse_bool("0"), parse_bool(" Yes ")
    (True, False, True)
    """
    lowered = str(text).strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


def positive_int(text: str) -> int:
    """An argparse type for counts that must be at least 1.

    >>> positive_int("3")
    3
    >>> positive_int("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a whole number of at least 1, got '0'
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """The settings every component honours (ARCHITECTURE.md, settings table)."""
    add_option(parser, "--bootstrap-servers", help="Kafka bootstrap address (host:port[,host:port])")
    add_option(parser, "--clickhouse-url", help="ClickHouse URL: chdb:///path (embedded) or http://host:8123")
    add_option(parser, "--data-dir", help="directory for local state (broker log, spool, chDB, batches)")
    add_option(parser, "--log-level", default="INFO", help="logging level")


def apply_env_defaults(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fill every option the user did not give from its environment variable, if set."""
    for action in _all_actions(parser, args):
        if not isinstance(action, EnvDefault):
            continue
        if action.dest in getattr(args, "_given", ()):
            continue
        raw = _env_value(action, args)
        if raw is None:
            continue
        value = raw
        if action.type is not None:
            try:
                value = action.type(raw)
            except (ValueError, argparse.ArgumentTypeError) as exc:
                parser.error(f"{action.env}={raw!r}: {exc}")
        setattr(args, action.dest, value)


def _env_value(action: EnvDefault, args: argparse.Namespace) -> str | None:
    """The option's environment variable, or else its old name's (with a note)."""
    raw = os.environ.get(action.env)
    if raw is None and action.old_env and os.environ.get(action.old_env) is not None:
        _note_renamed(args, renamed_note(action.old_env, action.env))
        return os.environ[action.old_env]
    return raw


def _all_actions(parser: argparse.ArgumentParser, args: argparse.Namespace):
    yield from parser._actions
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name in _chosen_commands(args):
                    yield from _all_actions(sub, args)


def _chosen_commands(args: argparse.Namespace) -> set[str]:
    return {value for key, value in vars(args).items() if key.startswith("_command") and value}


def command_parser(
    sub, name: str, handler: Callable[[argparse.Namespace], int | None], help: str, common: bool = True
) -> argparse.ArgumentParser:
    """Create a subcommand run by `handler(args)`; handlers import heavy modules inside themselves."""
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

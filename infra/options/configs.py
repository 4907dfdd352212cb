"""Command-line options generated from config dataclasses, so each option is written once.

A config is a dataclass whose fields carry their own help (TRL style):

    @dataclass(frozen=True)
    class SinkConfig:
        batch_rows: int = field(default=5000, metadata={"help": "flush after this many buffered rows"})

Field metadata:
- `help` (required to appear on the command line; fields without it are not options),
- `flag` (default `--batch-rows`), `env` (default `AGENTSTREAM_BATCH_ROWS`), `old_env` (a renamed
  variable, still read with a note for one release), `choices`,
- `prefix` on a field whose type is itself a config dataclass: its fields become options named
  `--<prefix><name>` (e.g. `dpo-` gives `--dpo-min-margin`), and it is rebuilt from them.

Types understood: str, int, float, bool (a flag pair `--x` / `--no-x`), Path,
`tuple[str|int|float, ...]` (comma-separated on the command line), `Literal[...]` (choices), and
`X | None` of those. Validation stays in the config's
`__post_init__`; this module only translates.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

from infra.options.env import ENV_PREFIX, add_option, command_parser, parse_bool
from schemas.settings import Settings

C = TypeVar("C")


def config_command(sub, name: str, handler, help: str, config: type) -> argparse.ArgumentParser:
    """A subcommand run by `handler(args)` whose options are the documented fields of `config`."""
    parser = command_parser(sub, name, handler, help)
    add_config_options(parser, config)
    return parser


def add_config_options(parser: argparse.ArgumentParser, cls: type, prefix: str = "") -> None:
    """Add one option per documented field of `cls` (and of its nested configs)."""
    for spec, hint in _fields(cls):
        if _is_config(hint):
            add_config_options(parser, hint, prefix + spec.metadata.get("prefix", ""))
            continue
        base, choices = _base_type(hint)
        default = _default(spec)
        kw: dict[str, Any] = {"help": spec.metadata["help"], "dest": _dest(spec, prefix)}
        kw["env"] = spec.metadata.get("env") or ENV_PREFIX + kw["dest"].upper()
        if spec.metadata.get("old_env"):  # a renamed variable, still read (with a note) for one release
            kw["old_env"] = spec.metadata["old_env"]
        if spec.metadata.get("choices") or choices:
            kw["choices"] = spec.metadata.get("choices") or choices
        if base is bool:
            kw["action"] = "store_true"
        else:
            kw["type"] = _parser_for(base, hint)
        kw["default"] = _show(default)
        add_option(parser, _flag(spec, prefix), **kw)


def config_from_args(cls: type[C], args: argparse.Namespace, prefix: str = "", **given: Any) -> C:
    """Build `cls` from parsed options (which already fell back to the environment).

    Options left unset keep the field's default; `given` overrides both (values the command computes)."""
    values: dict[str, Any] = dict(given)  # also fields that are not options (computed ones)
    for spec, hint in _fields(cls):
        if spec.name in given:
            continue
        if _is_config(hint):
            values[spec.name] = config_from_args(hint, args, prefix + spec.metadata.get("prefix", ""))
        else:
            raw = getattr(args, _dest(spec, prefix), None)
            if raw is not None and raw != _show(_default(spec)):
                values[spec.name] = _convert(raw, hint)
    return cls(**values)


def config_from_settings(cls: type[C], args: argparse.Namespace, **given: Any) -> C:
    """`config_from_args`, with the connection fields `cls` has (`bootstrap_servers`,
    `clickhouse_url`, `data_dir`) taken from the shared settings (their options, else `AGENTSTREAM_*`)."""
    settings = Settings.from_args(args)
    shared = {
        "bootstrap_servers": settings.bootstrap_servers,
        "clickhouse_url": settings.resolved_clickhouse_url,
        "data_dir": settings.data_dir,
    }
    names = {spec.name for spec in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return config_from_args(cls, args, **{k: v for k, v in shared.items() if k in names} | given)


def config_to_argv(config: object, prefix: str = "") -> list[str]:
    """The options that rebuild `config` in a child process: every documented field that differs
    from its default, as `[--flag, value, ...]` (inverse of `config_from_args`)."""
    argv: list[str] = []
    for spec, hint in _fields(type(config)):
        value = getattr(config, spec.name)
        if _is_config(hint):
            argv += config_to_argv(value, prefix + spec.metadata.get("prefix", ""))
        elif value != _default(spec) and isinstance(value, bool):
            argv.append(_flag(spec, prefix) if value else "--no-" + _flag(spec, prefix)[2:])
        elif value != _default(spec):
            argv += [_flag(spec, prefix), _show(value, empty_none=True)]
    return argv


def _fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls, include_extras=False)
    return [
        (spec, hints[spec.name])
        for spec in dataclasses.fields(cls)
        if spec.init and ("help" in spec.metadata or "prefix" in spec.metadata)
    ]


def _is_config(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _dest(spec: dataclasses.Field, prefix: str) -> str:
    return (prefix + spec.name).replace("-", "_")


def _flag(spec: dataclasses.Field, prefix: str) -> str:
    return spec.metadata.get("flag") or "--" + (prefix + spec.name).replace("_", "-")


def _default(spec: dataclasses.Field) -> Any:
    if spec.default is not dataclasses.MISSING:
        return spec.default
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return None


def _optional_inner(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return inner[0] if len(inner) == 1 else str
    return hint


def _base_type(hint: Any) -> tuple[Any, tuple | None]:
    """(the scalar type an option parses to, its choices for a Literal)."""
    inner = _optional_inner(hint)
    if typing.get_origin(inner) is Literal:
        choices = typing.get_args(inner)
        return type(choices[0]), choices
    if typing.get_origin(inner) is tuple:
        return tuple, None
    return inner, None


def _parser_for(base: Any, hint: Any):
    if base is tuple:
        return str  # comma-separated; converted by config_from_args
    if base in (int, float, str):
        return base
    return str  # Path and anything else: converted by config_from_args


def _convert(raw: Any, hint: Any) -> Any:
    base, _ = _base_type(hint)
    if base is tuple:
        if isinstance(raw, tuple):
            return raw
        item = (typing.get_args(_optional_inner(hint)) or (str,))[0]
        parts = [p.strip() for p in str(raw).split(",") if p.strip()]
        try:
            return tuple(item(p) for p in parts)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {item.__name__}s, got {raw!r}"
            ) from None
    if base is bool:
        return raw if isinstance(raw, bool) else parse_bool(raw)
    if base is Path:
        return Path(raw)
    return raw


def _show(value: Any, empty_none: bool = False) -> Any:
    """A default as the command line writes it (tuples comma-joined, paths as text)."""
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, Path):
        return str(value)
    if value is None and empty_none:
        return ""
    return value if not empty_none else str(value)

"""Fields of config dataclasses that carry their own help and bounds (TRL style), written once.

`option(default, help, ...)` is a dataclass field whose metadata the command-line generator
(`infra.options.configs`) reads: `help`, `flag` (default `--<name>`), `env` (default
`AGENTSTREAM_<NAME>`). Bounds (`ge`, `gt`, `le`, as in pydantic's `Field`) stay beside the help and
are checked by `check_bounds(config, error)` in the config's `__post_init__`, with a message naming
the option and the value. Pure: nothing here reads the environment.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import field, fields
from typing import Any

_BOUNDS: dict[str, tuple[str, Callable[[Any, Any], bool]]] = {
    "ge": (">=", operator.ge),
    "gt": (">", operator.gt),
    "le": ("<=", operator.le),
}


def option(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    env: str | None = None,
    old_env: str | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
) -> Any:
    """A documented config field: a command-line option with an environment fallback.

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class C:
    ...     batch_rows: int = option(5000, "flush after this many rows", ge=1)
    >>> C.__dataclass_fields__["batch_rows"].metadata["help"], C().batch_rows
    ('flush after this many rows', 5000)
    """
    named = {"flag": flag, "env": env, "old_env": old_env}  # old_env: renamed, read for one release
    metadata: dict[str, Any] = {"help": help, **{k: v for k, v in named.items() if v}}
    bounds = {k: v for k, v in {"ge": ge, "gt": gt, "le": le}.items() if v is not None}
    if bounds:
        metadata["bounds"] = bounds
    return field(default=default, metadata=metadata)


def flag_of(spec: Any) -> str:
    """The command-line flag of a dataclass field: its `flag` metadata, else `--<name>`."""
    return spec.metadata.get("flag") or "--" + spec.name.replace("_", "-")


def check_bounds(config: object, error: type[Exception]) -> None:
    """Raise `error` naming the first field whose value breaks a bound of its `option`.

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class C:
    ...     grace_seconds: float = option(1.0, "wait this long", gt=0)
    >>> check_bounds(C(grace_seconds=0), ValueError)
    Traceback (most recent call last):
    ...
    ValueError: --grace-seconds: must be > 0, got 0
    """
    for spec in fields(config):  # type: ignore[arg-type]
        value = getattr(config, spec.name)
        for bound, limit in spec.metadata.get("bounds", {}).items():
            symbol, holds = _BOUNDS[bound]
            if value is not None and not holds(value, limit):
                raise error(f"{flag_of(spec)}: must be {symbol} {limit}, got {value!r}")

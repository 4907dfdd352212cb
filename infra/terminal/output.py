"""What the CLI shows a person: the one module that writes to stdout / stderr directly.

Everything else logs (`logging.getLogger(__name__)`); commands print their results through here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable


def say(*parts: object, sep: str = " ") -> None:
    """A line of a command's result, on stdout."""
    print(*parts, sep=sep, flush=True)


def lines(rows: Iterable[object]) -> None:
    """Several result lines, on stdout."""
    for row in rows:
        say(row)


def warn(text: str) -> None:
    """A line for the person at the terminal that is not part of the result, on stderr."""
    print(text, file=sys.stderr, flush=True)


def error(text: str) -> None:
    """A failed command's one-line reason, on stderr."""
    print(f"agentstream: error: {text}", file=sys.stderr, flush=True)

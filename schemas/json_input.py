"""JSON text a user hands us (a task file line, a tool argument) read as one JSON object.

Errors are the caller's own exception (its class, or a function making one from the message), the
message starting with `where` (a file:line, an argument name or a request body), so each package
keeps its exception root and every message says where to look.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson


def json_object(text: str | bytes, where: str, error: Callable[[str], Exception]) -> dict[str, Any]:
    """The JSON object `text` holds; `error(where: ...)` when it is not valid JSON or not an object.

    >>> json_object('{"a": 1}', "line 1", ValueError)
    {'a': 1}
    >>> json_object("[1]", "line 2", ValueError)
    Traceback (most recent call last):
    ...
    ValueError: line 2: expected a JSON object, got list
    """
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise error(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise error(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value

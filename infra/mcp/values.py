"""Tool results as plain JSON values: what an MCP client receives as structured content."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any
from uuid import UUID


def jsonable(value: Any) -> Any:
    """`value` with every leaf a JSON value: times as ISO text, NaN and infinities as None
    (JSON has neither), tuples and sets as lists, pydantic models dumped.

    >>> from datetime import UTC, datetime
    >>> jsonable({"at": datetime(2026, 1, 2, tzinfo=UTC), "p": float("nan"), "k": (1, 2)})
    {'at': '2026-01-02T00:00:00+00:00', 'p': None, 'k': [1, 2]}
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return jsonable(float(value))
    if isinstance(value, Enum):
        return jsonable(value.value)
    if isinstance(value, UUID | Path):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump(mode="json"))
    return str(value)

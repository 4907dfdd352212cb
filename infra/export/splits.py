"""Which split a row goes to: decided by its task id alone, so a task can never be in two splits.

`split_of(task_id, fractions, seed)` hashes `seed:task_id` (sha256) to a number in [0, 1) and cuts
it at the cumulative fractions. The rule depends on nothing but the task id and the seed: every row
of a task lands in the same split, in this export and in every later export with the same seed (a
task added later never moves an old one). The price is that split sizes are only near the fractions
on few tasks. A row without a task id is an error (never guessed). Pure; no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from infra.export.errors import ExportError

SPLITS: tuple[str, ...] = ("train", "validation", "test")


def parse_fractions(value: str | Sequence[float]) -> tuple[float, float, float]:
    """Train / validation / test fractions from "0.8,0.1,0.1" (or a sequence); they must sum to 1.

    >>> parse_fractions("0.8,0.1,0.1")
    (0.8, 0.1, 0.1)
    >>> parse_fractions("0.9,0.1")
    Traceback (most recent call last):
    ...
    infra.export.errors.ExportError: --split: give three fractions train,validation,test, got '0.9,0.1'
    """
    try:
        parts = [float(p) for p in value.split(",")] if isinstance(value, str) else [float(p) for p in value]
    except ValueError:
        raise ExportError(f"--split: fractions must be numbers, got {value!r}") from None
    if len(parts) != 3:
        raise ExportError(f"--split: give three fractions train,validation,test, got {value!r}")
    if any(p < 0 for p in parts) or abs(sum(parts) - 1.0) > 1e-6:
        raise ExportError(f"--split: fractions must be >= 0 and sum to 1, got {value!r}")
    return parts[0], parts[1], parts[2]


def task_point(task_id: str, seed: int = 0) -> float:
    """The task's place in [0, 1): the first 8 bytes of sha256("<seed>:<task_id>").

    >>> task_point("task-a") == task_point("task-a")
    True
    """
    digest = hashlib.sha256(f"{seed}:{task_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_of(task_id: str, fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0) -> str:
    """The split of a task.

    >>> split_of("task-a", (1.0, 0.0, 0.0))
    'train'
    >>> split_of("task-a", (0.0, 0.0, 1.0))
    'test'
    """
    point, edge = task_point(task_id, seed), 0.0
    for name, fraction in zip(SPLITS, fractions, strict=True):
        edge += fraction
        if point < edge:
            return name
    return next(name for name, f in reversed(list(zip(SPLITS, fractions, strict=True))) if f > 0)


def task_of(row: dict[str, Any], index: int) -> str:
    """The task id a row is split by; an error naming the row when it has none."""
    task = row.get("task_id")
    if not isinstance(task, str) or not task:
        raise ExportError(f"row {index}: no task_id (got {task!r}); every exported row must name its task")
    return task


def assign(
    rows: Iterable[dict[str, Any]], fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0
) -> dict[str, list[dict[str, Any]]]:
    """Rows by split (every split present, possibly empty), row order kept within a split.

    >>> rows = [{"task_id": "a", "n": 1}, {"task_id": "a", "n": 2}]
    >>> sum(len(v) for v in assign(rows).values()), len({split_of("a")})
    (2, 1)
    """
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in SPLITS}
    cache: dict[str, str] = {}
    for i, row in enumerate(rows):
        task = task_of(row, i)
        if task not in cache:
            cache[task] = split_of(task, fractions, seed)
        out[cache[task]].append(row)
    return out

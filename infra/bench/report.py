"""Benchmark reporting: medians over repeats, a printed table and a JSON file per benchmark."""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from infra.options.output_file import write_atomic
from infra.terminal.output import lines, say
from infra.terminal.tables import format_table


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def repeat(fn: Callable[[], float], repeats: int) -> list[float]:
    """Call `fn` (which returns one figure) `repeats` times."""
    return [fn() for _ in range(max(1, repeats))]


def machine() -> dict:
    import os

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_report(name: str, result: dict, output: str | None = None) -> Path:
    """Print `result["rows"]` as a table and write the whole result (plus machine info) as JSON."""
    path = Path(output or f"bench-results/{name}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"benchmark": name, "machine": machine(), **result}
    write_atomic(path, json.dumps(document, indent=2, default=str))  # whole: never half a file
    say(f"\n## agentstream bench {name}\n")
    say(format_table(result.get("rows", [])))
    for title, key in result.get("tables", {}).items():  # further tables: title -> the result's key
        say(f"\n{title}\n")
        say(format_table(result.get(key, [])))
    lines(f"- {note}" for note in result.get("notes", []))
    say(f"\nJSON: {path}")
    return path

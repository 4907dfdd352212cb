"""The one table every part of `agentstream bench policy` writes rows into: its columns, and a
row with the columns a case does not fill left empty.
"""

from __future__ import annotations

COLUMNS = ("case", "concurrency", "recording", "requests", "tokens_per_s", "requests_per_s")
COLUMNS += ("p50_ms", "p99_ms", "max_ms", "cpu_ms_per_call")


def table_row(case: str, **values) -> dict:
    return {key: values.get(key) for key in COLUMNS} | {"case": case}

"""Plain markdown tables of flat rows, for command results, the demo and benchmark reports."""

from __future__ import annotations


def format_table(rows: list[dict]) -> str:
    """A plain markdown table of `rows` (list of flat dicts with the same keys)."""
    if not rows:
        return "(no rows)"
    keys = list(rows[0])
    cells = [[_fmt(r.get(k)) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = "| " + " | ".join(k.ljust(w) for k, w in zip(keys, widths, strict=True)) + " |"
    sep = "| " + " | ".join("-" * w for w in widths) + " |"
    body = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in cells]
    return "\n".join([line, sep, *body])


def _fmt(value) -> str:
    if isinstance(value, float):
        if value != value:
            return "n/a"
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return "" if value is None else str(value)

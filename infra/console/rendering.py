"""The console's page rendering: the Jinja environment of its templates and the filters they use
(`num`, `pct`, `when`, `qs`): pure formatting of numbers, times and query strings for a person.
"""

from __future__ import annotations

import math
from datetime import date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

TEMPLATES_DIR = Path(__file__).parent / "templates"


def fmt_number(value: Any, digits: int = 3) -> str:
    """A number for a person; None and NaN are a dash (never a made-up zero).

    >>> fmt_number(0.123456), fmt_number(None), fmt_number(float("nan")), fmt_number(1234)
    ('0.123', '—', '—', '1,234')
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def fmt_percent(value: Any) -> str:
    """
    >>> fmt_percent(0.5), fmt_percent(None)
    ('50.0%', '—')
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{100 * float(value):.1f}%"


def fmt_time(value: Any) -> str:
    """
    >>> fmt_time(datetime(2026, 11, 25, 14, 30, 1, 500000))
    '2026-11-25 14:30:01'
    """
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, date):
        return value.isoformat()
    return "—" if value is None else str(value)


def query_string(values: dict[str, Any]) -> str:
    return urlencode({k: v for k, v in values.items() if v not in (None, "")})


def page_templates():
    """The Jinja environment of the console's pages, with the filters above registered."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=fmt_number, when=fmt_time, qs=query_string, pct=fmt_percent)
    return env

"""A query and its bound parameters, kept apart until ClickHouse binds them.

Every query the CLI and the console run on user input is an `Sql`: the text names each value as a
typed ClickHouse placeholder (`{domain:String}`) and `params` carries the values, which
clickhouse-connect sends beside the query (`param_domain=...`), never inside its text. Identifiers
(a column to group by) are never parameters: they are checked against a fixed list before they are
put into the text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sql:
    """Query text with `{name:Type}` placeholders and the values to bind to them."""

    text: str
    params: Mapping[str, Any] = field(default_factory=dict)


def as_sql(query: Sql | str) -> Sql:
    """An `Sql` for plain text too (fixed queries that take no values).

    >>> as_sql("SELECT 1")
    Sql(text='SELECT 1', params={})
    """
    return query if isinstance(query, Sql) else Sql(query)


def run(client, query: Sql | str) -> list[tuple]:
    """The rows of `query` on a clickhouse-connect client, its values bound server-side."""
    query = as_sql(query)
    return list(client.query(query.text, parameters=dict(query.params) or None).result_rows)


def run_dicts(client, query: Sql | str) -> list[dict]:
    """The rows of `query` as dicts keyed by column name."""
    query = as_sql(query)
    result = client.query(query.text, parameters=dict(query.params) or None)
    return rows_as_dicts(result.column_names, result.result_rows)


def rows_as_dicts(columns: Sequence[str], rows: Sequence[Sequence]) -> list[dict]:
    """
    >>> rows_as_dicts(["a", "b"], [(1, 2)])
    [{'a': 1, 'b': 2}]
    """
    return [dict(zip(columns, row, strict=True)) for row in rows]

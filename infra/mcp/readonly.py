"""The `sql` tool's guard: only one read-only statement, with a row limit and a time limit.

What holds where:
- The statement check (`check_read_only`) runs here, before anything is sent, for every engine: one
  statement (a `;` may only end it), whose first keyword is SELECT, WITH, SHOW, DESCRIBE or DESC; no
  `INTO OUTFILE`; no table function that reaches outside the database (`file`, `url`, `s3`,
  `remote`, `executable`, ...). Comments and quoted text are skipped, so a keyword inside a string
  neither refuses nor passes a query.
- The row limit: a SELECT / WITH query is wrapped as `SELECT * FROM (<query>) LIMIT n+1`, so the
  engine never returns more than n+1 rows (one more tells that there were more); SHOW / DESCRIBE
  results are cut to n after fetching. The same holds on a ClickHouse server and on the embedded
  chDB endpoint.
- The time limit: on a ClickHouse server, `max_execution_time` (and `readonly=2`, so the server
  itself refuses writes) are sent as settings. The embedded chDB endpoint ignores per-request
  settings (clients/clickhouse/endpoint.py), so the tool also stops waiting after the limit and
  reports it; the query then runs to its end inside the serving process, but its result is dropped.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from infra.mcp.errors import McpToolError

ALLOWED_FIRST = ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC")
WRAPPED_FIRST = ("SELECT", "WITH")
# Table functions that read or run things outside the database's own tables.
OUTSIDE_FUNCTIONS = frozenset(
    ("file", "url", "urlcluster", "s3", "s3cluster", "gcs", "hdfs", "hdfscluster", "azureblobstorage",
     "azureblobstoragecluster", "remote", "remotesecure", "cluster", "clusterallreplicas", "mysql",
     "postgresql", "mongodb", "redis", "sqlite", "jdbc", "odbc", "executable", "input", "deltalake",
     "hudi", "iceberg", "fuzzjson")
)  # fmt: skip
_FIRST = re.compile(r"[(\s]*([A-Za-z_][A-Za-z0-9_]*)")


def strip_quoted(query: str) -> str:
    """`query` with comments removed and quoted text (strings, quoted names) blanked to `''`.

    >>> strip_quoted("SELECT 'a;b' -- drop\\n, `x;` /* ; */ FROM t")
    "SELECT '' \\n, ''   FROM t"
    """
    out, i, n = [], 0, len(query)
    while i < n:
        ch, two = query[i], query[i : i + 2]
        if two == "--" or ch == "#":
            end = query.find("\n", i)
            i = n if end < 0 else end
        elif two == "/*":
            end = query.find("*/", i + 2)
            i = n if end < 0 else end + 2
            out.append(" ")
        elif ch in "'\"`":
            i = _end_of_quoted(query, i)
            out.append("''")
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _end_of_quoted(query: str, start: int) -> int:
    quote, i = query[start], start + 1
    while i < len(query):
        if query[i] == "\\":
            i += 2
        elif query[i] == quote:
            if query[i + 1 : i + 2] == quote:  # a doubled quote stands for itself
                i += 2
            else:
                return i + 1
        else:
            i += 1
    raise McpToolError("query: a quoted string or name is not closed")


def check_read_only(query: str) -> str:
    """The statement's first keyword, upper-cased; raises McpToolError saying why a query is refused.

    >>> check_read_only("  -- top rewards\\nselect 1;")
    'SELECT'
    >>> check_read_only("INSERT INTO t VALUES (1)")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    infra.mcp.errors.McpToolError: query: INSERT is refused: the sql tool is read-only (allowed: ...)
    """
    if not isinstance(query, str) or not query.strip():
        raise McpToolError(f"query: expected a non-empty SQL statement, got {query!r}")
    bare = strip_quoted(query).strip()
    if ";" in bare.rstrip("; \t\r\n"):
        raise McpToolError("query: one statement only (a ';' may only end it)")
    leading = _FIRST.match(bare)  # the statement's own first word (opening parentheses allowed)
    first = leading.group(1).upper() if leading else ""
    if first not in ALLOWED_FIRST:
        shown = first or bare[:20]
        raise McpToolError(
            f"query: {shown} is refused: the sql tool is read-only (allowed: {', '.join(ALLOWED_FIRST)})"
        )
    _check_body(bare)
    return first


def _check_body(bare: str) -> None:
    if re.search(r"\bINTO\s+OUTFILE\b", bare, re.IGNORECASE):
        raise McpToolError("query: INTO OUTFILE is refused: the sql tool is read-only")
    for name in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", bare):
        if name.lower() in OUTSIDE_FUNCTIONS:
            raise McpToolError(
                f"query: table function {name}() is refused: the sql tool reads only the database's tables"
            )


def limited_text(query: str, first: str, max_rows: int) -> str:
    """The text sent: SELECT / WITH wrapped to return at most `max_rows + 1` rows.

    >>> limited_text("SELECT 1;", "SELECT", 10)
    'SELECT * FROM (\\nSELECT 1\\n) LIMIT 11'
    >>> limited_text("SHOW TABLES", "SHOW", 10)
    'SHOW TABLES'
    """
    body = query.strip().rstrip(";").rstrip()
    if first not in WRAPPED_FIRST:
        return body
    return f"SELECT * FROM (\n{body}\n) LIMIT {max_rows + 1}"


def server_settings(timeout_s: float, max_rows: int, already_read_only: bool = False) -> dict[str, Any]:
    """What a ClickHouse server enforces itself (the embedded endpoint ignores them). A user that is
    read-only already may not change `readonly`, so it is then left out."""
    settings: dict[str, Any] = {} if already_read_only else {"readonly": 2}  # 2: settings still apply
    return settings | {
        "max_execution_time": max(1, int(timeout_s)),
        "max_result_rows": max_rows + 1,
        "result_overflow_mode": "break",
    }


def _read_only_user(client) -> bool:
    """Whether the server already runs this client's queries read-only (clickhouse-connect knows)."""
    setting = (getattr(client, "server_settings", None) or {}).get("readonly")
    return setting is not None and str(getattr(setting, "value", "0")) != "0"


def run_read_only(client, query: str, max_rows: int, timeout_s: float) -> dict[str, Any]:
    """Check and run `query` on a clickhouse-connect client under both limits.

    Returns `columns`, `rows` (dicts), `row_count`, `truncated` (more rows than `max_rows` existed)."""
    first = check_read_only(query)
    text = limited_text(query, first, max_rows)
    settings = server_settings(timeout_s, max_rows, _read_only_user(client))
    pool = ThreadPoolExecutor(1, thread_name_prefix="agentstream-mcp-sql")
    future = pool.submit(client.query, text, settings=settings)
    try:
        result = future.result(timeout=timeout_s)
    except FutureTimeout:
        raise McpToolError(f"query: gave up after the time limit of {timeout_s:g} s") from None
    finally:
        pool.shutdown(wait=False)
    columns = list(result.column_names)
    rows = [dict(zip(columns, row, strict=True)) for row in result.result_rows]
    return {
        "columns": columns,
        "rows": rows[:max_rows],
        "row_count": min(len(rows), max_rows),
        "truncated": len(rows) > max_rows,
        "max_rows": max_rows,
    }

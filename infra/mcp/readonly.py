"""The `sql` tool: one read-only SELECT over the project's tables, under row, time and memory limits.

What holds where (docs/mcp.md, docs/security.md):
- The engine. The tool connects as the endpoint's `reader` (clients/clickhouse/endpoint.py): a chDB
  session with `readonly=1`, so ClickHouse itself refuses writes, DDL, table functions that reach
  outside (file, url, s3, remote, executable...) and any settings change, and its
  `max_execution_time` / `max_memory_usage` cancel a runaway query and free the session. The
  endpoint also refuses `INTO OUTFILE`, `file()` and several statements for every reader. On a
  ClickHouse server the same limits are sent as settings with `readonly=2`.
- The structure, read by ClickHouse's own parser, not by a word filter: `formatQuery` parses the
  text as exactly one statement (a second one, hidden by dollar-quoting or comments, is a syntax
  error) and returns its canonical text (no comments, strings in one quoting, function names
  unquoted); `EXPLAIN AST` of that text gives the tree. Only a SELECT (UNION and WITH allowed)
  whose tables are the `agentstream` database's, a few `system` tables, CTEs or in-engine
  generators (`numbers`) passes; `SHOW TABLES` and `DESCRIBE TABLE` pass as listings. The
  canonical text is what runs, so what was checked is what the engine executes.
- The row limit: a SELECT is wrapped as `SELECT * FROM (<query>) LIMIT n+1` (one more row tells
  that there were more); listings are cut to n after fetching.
- The tool still stops waiting after `sql_timeout_s` (a limit lower than the engine's is the
  tool's own; the engine's cancels the query).
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from clients.clickhouse import DATABASE
from clients.clickhouse.statement import bare_words, first_word, reader_refusal
from infra.mcp.errors import McpToolError

ALLOWED_FIRST = ("SELECT", "WITH", "SHOW TABLES", "DESCRIBE TABLE")
# schema listings and generators; not query_log / processes (other clients' queries) nor users
SYSTEM_TABLES = frozenset(
    ("system.one", "system.numbers", "system.numbers_mt", "system.tables", "system.columns",
     "system.databases")
)  # fmt: skip
GENERATORS = frozenset(("numbers", "numbers_mt", "zeros", "zeros_mt", "generate_series", "values"))
MAX_QUERY_CHARS = 100_000
_LISTING = re.compile(r"^(SHOW TABLES|DESCRIBE TABLE)\b")
# the canonical text's own output format (what the client appends to EXPLAIN lands in its AST)
_FORMAT_CLAUSE = re.compile(r"\bFORMAT\s+\w+\s*$")


@dataclass(frozen=True)
class Node:
    """One line of `EXPLAIN AST`: its kind (`Function`, `TableIdentifier`...), its text, its depth."""

    kind: str
    text: str
    depth: int


def parse_ast(explained: str) -> list[Node]:
    """`EXPLAIN AST` output as nodes in order (a child follows its parent, one space deeper).

    >>> parse_ast("SelectWithUnionQuery (children 1)\\n ExpressionList")[1]
    Node(kind='ExpressionList', text='', depth=1)
    """
    nodes = []
    for line in explained.splitlines():
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip(" "))
        kind, _, text = line.strip().partition(" ")
        nodes.append(Node(kind, re.sub(r"\s*\(children \d+\)$", "", text), depth))
    return nodes


def select_refusal(nodes: list[Node]) -> str | None:
    """Why this SELECT's tree is refused, or None: it reads only allowed tables and no file.

    >>> tree = parse_ast("SelectWithUnionQuery\\n TableExpression\\n  TableIdentifier system.users")
    >>> select_refusal(tree)  # doctest: +ELLIPSIS
    'table system.users is refused: the sql tool reads the agentstream database (and system.columns, ...)'
    """
    if not nodes or nodes[0].kind != "SelectWithUnionQuery":
        return "only a SELECT is allowed"
    for i, node in enumerate(nodes):
        name = node.text.split(" (alias")[0]
        if node.kind == "Function" and name.lower() == "file":
            return "file() is refused: the sql tool reads only the database's tables"
        if node.kind == "Set":
            return "a SETTINGS clause is refused: the limits are the engine's"
        parent = _parent(nodes, i)
        if parent is None or parent.kind != "TableExpression":
            continue
        if node.kind == "TableIdentifier" and not _allowed_table(name):
            allowed = ", ".join(sorted(SYSTEM_TABLES))
            return f"table {name} is refused: the sql tool reads the {DATABASE} database (and {allowed})"
        if node.kind == "Function" and name.lower() not in GENERATORS:
            return f"table function {name}() is refused: the sql tool reads only the database's tables"
    return None


def _parent(nodes: list[Node], index: int) -> Node | None:
    depth = nodes[index].depth
    for node in reversed(nodes[:index]):
        if node.depth < depth:
            return node
    return None


def _allowed_table(name: str) -> bool:
    # a bare name is a CTE or a table of the connection's database, which the tool sets to agentstream
    return "." not in name or name.startswith(f"{DATABASE}.") or name in SYSTEM_TABLES


def check_read_only(query: str) -> None:
    """What is refused before anything is sent: no statement at all, or one too long."""
    if not isinstance(query, str) or not query.strip():
        raise McpToolError(f"query: expected a non-empty SQL statement, got {query!r}")
    if len(query) > MAX_QUERY_CHARS:
        raise McpToolError(f"query: {len(query)} characters, the limit is {MAX_QUERY_CHARS}")


def canonical(client, query: str) -> str:
    """ClickHouse's canonical text of `query`, which must be exactly one statement."""
    try:
        result = client.query("SELECT formatQuery({q:String})", parameters={"q": query})
    except Exception as exc:
        if "Multi-statements" in str(exc):
            raise McpToolError("query: one statement only (a ';' may only end it)") from None
        raise McpToolError(f"query: ClickHouse cannot parse it: {_first_line(exc)}") from None
    return str(result.result_rows[0][0]).strip()


def checked(client, query: str) -> tuple[str, str]:
    """(`canonical text`, `kind`: SELECT or a listing) of a query the tool may run, else McpToolError."""
    check_read_only(query)
    text = canonical(client, query)
    listing = _LISTING.match(text)
    first = listing.group(1) if listing else first_word(text)
    if first not in ALLOWED_FIRST:
        raise McpToolError(
            f"query: {first or text[:20]} is refused: the sql tool is read-only "
            f"(allowed: {', '.join(ALLOWED_FIRST)})"
        )
    reason = reader_refusal(text)
    if reason is None and _FORMAT_CLAUSE.search(bare_words(text)):
        reason = "a FORMAT clause is refused: the sql tool returns rows"
    if reason is None and not listing:
        explained = client.query(f"EXPLAIN AST {text}").result_rows
        reason = select_refusal(parse_ast("\n".join(str(row[0]) for row in explained)))
    if reason:
        raise McpToolError(f"query: {reason}")
    return text, "SELECT" if not listing else "LISTING"


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__


def limited_text(text: str, kind: str, max_rows: int) -> str:
    """The text sent: a SELECT wrapped to return at most `max_rows + 1` rows.

    >>> limited_text("SELECT 1", "SELECT", 10)
    'SELECT * FROM (\\nSELECT 1\\n) LIMIT 11'
    >>> limited_text("SHOW TABLES", "LISTING", 10)
    'SHOW TABLES'
    """
    if kind != "SELECT":
        return text
    return f"SELECT * FROM (\n{text}\n) LIMIT {max_rows + 1}"


def server_settings(timeout_s: float, max_rows: int, readonly: str = "0") -> dict[str, Any]:
    """What a ClickHouse server enforces itself, given the `readonly` the session already has.
    `readonly=1` (the embedded endpoint's reader) forbids changing any setting: its own limits
    apply and nothing is sent. `readonly=2` may change settings but not `readonly` itself."""
    if readonly == "1":
        return {}
    settings: dict[str, Any] = {} if readonly == "2" else {"readonly": 2}  # 2: settings still apply
    return settings | {
        "max_execution_time": max(1, int(timeout_s)),
        "max_result_rows": max_rows + 1,
        "result_overflow_mode": "break",
    }


def _session_readonly(client) -> str:
    """The `readonly` this client's session runs with (clickhouse-connect read system.settings)."""
    setting = (getattr(client, "server_settings", None) or {}).get("readonly")
    return "0" if setting is None else str(getattr(setting, "value", "0"))


def run_read_only(client, query: str, max_rows: int, timeout_s: float) -> dict[str, Any]:
    """Check and run `query` on a clickhouse-connect client (a reader) under the limits.

    Returns `columns`, `rows` (dicts), `row_count`, `truncated` (more rows than `max_rows` existed)."""
    text, kind = checked(client, query)
    sent = limited_text(text, kind, max_rows)
    settings = server_settings(timeout_s, max_rows, _session_readonly(client))
    pool = ThreadPoolExecutor(1, thread_name_prefix="agentstream-mcp-sql")
    future = pool.submit(client.query, sent, settings=settings)
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

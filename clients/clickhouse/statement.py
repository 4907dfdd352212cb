"""What a reader of the embedded endpoint may run, decided on ClickHouse's own reading of the query.

The engine refuses writes, DDL, settings changes and table functions for a `readonly=1` session,
but chDB runs ClickHouse's client-side parts in-process, so some things pass it that a reader
must not do: `INTO OUTFILE` (the file is written by the serving process), the scalar `file()`
function (it reads a local file), several statements in one request (chDB runs them all), and
`DESCRIBE` of a table function (`DESCRIBE url(...)`, `s3`, `mysql`, `sqlite`: the engine infers
the schema by fetching or opening the source, and its errors quote what it read).
A reader's query is therefore first rewritten by the engine's formatter (`formatQuery`, which
parses exactly one statement and refuses more), and the canonical text it returns, with no
comments, dollar-quoting or quoted function names left, is checked here and is what runs.

This module only decides on text; the endpoint and the MCP `sql` tool do the I/O.
"""

from __future__ import annotations

import re

# The statements a reader runs (console, CLI `sql`, clickhouse-connect's own probes, MCP).
READER_STATEMENTS = ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN")
_FIRST = re.compile(r"[(\s]*([A-Za-z_]+)")
# ClickHouse's formatter writes strings as '...' and names as `...`, both with backslash escapes.
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|`(?:[^`\\]|\\.)*`", re.DOTALL)
# DESCRIBE reads a name (`DESCRIBE TABLE db.t`); a `(` after it is a table function or a subquery
_DESCRIBE_CALL = re.compile(r"[(\s]*DESC(?:RIBE)?\s+(?:TABLE\s+)?[^(]*\(", re.IGNORECASE)
_TABLE_OVERRIDE = re.compile(r"[(\s]*EXPLAIN\s+TABLE\s+OVERRIDE\b", re.IGNORECASE)


def sql_literal(text: str) -> str:
    """`text` as a ClickHouse string literal (backslash escapes).

    >>> sql_literal("it's \\\\ ok")
    "'it\\\\'s \\\\\\\\ ok'"
    """
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def format_query_sql(query: str, marker: str = "") -> str:
    """The statement that asks the engine for `query`'s canonical text (one statement or an error),
    after `marker`, so the caller can tell that answer from anything else.

    >>> format_query_sql("SELECT 1", "m1")
    "SELECT concat('m1', formatQuery('SELECT 1'))"
    """
    return f"SELECT concat({sql_literal(marker)}, formatQuery({sql_literal(query)}))"


def bare_words(canonical: str) -> str:
    """Canonical text with its strings and quoted names blanked, so only keywords and names remain.

    >>> bare_words("SELECT 'INTO OUTFILE' AS `file(`")
    'SELECT  AS '
    """
    return _QUOTED.sub("", canonical)


def first_word(canonical: str) -> str:
    """
    >>> first_word("(SELECT 1) UNION ALL (SELECT 2)")
    'SELECT'
    """
    found = _FIRST.match(canonical)
    return found.group(1).upper() if found else ""


def reader_refusal(canonical: str) -> str | None:
    """Why a reader may not run this canonical statement, or None when it may.

    >>> reader_refusal("SELECT 1")
    >>> reader_refusal("SELECT 'x'\\nINTO OUTFILE '/tmp/x'")
    'INTO OUTFILE is refused for a reader (it writes a file as the serving process)'
    >>> reader_refusal("DESCRIBE TABLE url('http://169.254.169.254/', 'CSV')")
    'DESCRIBE of a table function or query is refused for a reader (it fetches the source)'
    >>> reader_refusal("DESCRIBE TABLE agentstream.steps")
    >>> reader_refusal("KILL QUERY WHERE 1 ASYNC")
    'KILL is refused for a reader (allowed: SELECT, WITH, SHOW, DESCRIBE, DESC, EXISTS, EXPLAIN)'
    """
    first = first_word(canonical)
    if first not in READER_STATEMENTS:
        allowed = ", ".join(READER_STATEMENTS)
        return f"{first or 'an empty statement'} is refused for a reader (allowed: {allowed})"
    words = bare_words(canonical)
    if re.search(r"\bINTO\s+OUTFILE\b", words, re.IGNORECASE):
        return "INTO OUTFILE is refused for a reader (it writes a file as the serving process)"
    if re.search(r"\bfile\s*\(", words, re.IGNORECASE):
        return "file() is refused for a reader (it reads a local file as the serving process)"
    if ";" in words:
        return "one statement only"
    if _DESCRIBE_CALL.match(words):
        return "DESCRIBE of a table function or query is refused for a reader (it fetches the source)"
    if _TABLE_OVERRIDE.match(words):
        return "EXPLAIN TABLE OVERRIDE is refused for a reader (it opens the table function)"
    return None

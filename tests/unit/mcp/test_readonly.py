"""The sql tool's structural check on ClickHouse's own parse tree (no engine needed: the trees are
`EXPLAIN AST` output as chDB prints it); the engine-backed corpus is tests/integration/mcp."""

from __future__ import annotations

import pytest

from clients.clickhouse.statement import reader_refusal
from infra.mcp.errors import McpToolError
from infra.mcp.readonly import check_read_only, limited_text, parse_ast, select_refusal, server_settings

SELECT_FROM = """SelectWithUnionQuery (children 1)
 ExpressionList (children 1)
  SelectQuery (children 2)
   ExpressionList (children 1)
    Asterisk
   TablesInSelectQuery (children 1)
    TablesInSelectQueryElement (children 1)
     TableExpression (children 1)
      {table}
"""


@pytest.mark.parametrize(
    "table",
    ["TableIdentifier agentstream.steps", "TableIdentifier a (alias x)", "TableIdentifier system.tables",
              "Function numbers (children 1)"],
)  # fmt: skip
def test_project_tables_ctes_and_generators_pass(table):
    assert select_refusal(parse_ast(SELECT_FROM.format(table=table))) is None


@pytest.mark.parametrize(
    ("table", "reason"),
    [
        ("TableIdentifier system.users", "table system.users is refused"),
        ("TableIdentifier system.query_log", "table system.query_log is refused"),
        ("TableIdentifier other.secrets (alias s)", "table other.secrets is refused"),
        ("Function file (children 1)", "file() is refused"),
        ("Function url (alias u) (children 1)", "table function url() is refused"),
        ("Function remote (children 1)", "table function remote() is refused"),
        ("Function merge (children 1)", "table function merge() is refused"),
    ],
)
def test_other_tables_and_table_functions_are_refused(table, reason):
    assert reason in select_refusal(parse_ast(SELECT_FROM.format(table=table)))


def test_a_scalar_file_call_settings_and_other_statements_are_refused():
    scalar = (
        "SelectWithUnionQuery\n ExpressionList\n  SelectQuery\n   ExpressionList\n    Function file (alias f)"
    )
    assert "file() is refused" in select_refusal(parse_ast(scalar))
    assert "SETTINGS" in select_refusal(parse_ast("SelectWithUnionQuery\n ExpressionList\n Set"))
    assert select_refusal(parse_ast("ShowTables (children 1)")) == "only a SELECT is allowed"


def test_the_canonical_text_is_checked_outside_its_strings():
    assert reader_refusal("SELECT 'INTO OUTFILE' AS `file(`") is None
    assert "INTO OUTFILE" in reader_refusal("SELECT 1\nINTO OUTFILE 'x'")
    assert "KILL is refused" in reader_refusal("KILL QUERY WHERE 1 ASYNC")


@pytest.mark.parametrize("query", ["", "   ", None, "x" * 100_001])
def test_empty_or_oversized_queries_are_refused_before_connecting(query):
    with pytest.raises(McpToolError, match="query:"):
        check_read_only(query)


def test_a_select_is_limited_in_the_engine_a_listing_after_fetching():
    assert limited_text("SELECT 1", "SELECT", 5) == "SELECT * FROM (\nSELECT 1\n) LIMIT 6"
    assert limited_text("DESCRIBE TABLE t", "LISTING", 5) == "DESCRIBE TABLE t"


def test_server_settings_make_a_clickhouse_server_refuse_writes_and_stop_in_time():
    assert server_settings(2.5, 100) == {
        "readonly": 2,
        "max_execution_time": 2,
        "max_result_rows": 101,
        "result_overflow_mode": "break",
    }
    assert "readonly" not in server_settings(2.5, 100, readonly="2")
    assert server_settings(2.5, 100, readonly="1") == {}  # the endpoint's reader: its own limits hold

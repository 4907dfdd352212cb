"""The sql tool's read-only guard: what passes, what is refused and why (no engine needed)."""

from __future__ import annotations

import pytest

from infra.mcp.errors import McpToolError
from infra.mcp.readonly import check_read_only, limited_text, server_settings, strip_quoted


@pytest.mark.parametrize(
    ("query", "first"),
    [
        ("SELECT 1", "SELECT"),
        ("select count() from agentstream.steps;", "SELECT"),
        ("  -- newest first\n  SELECT * FROM agentstream.trajectories ORDER BY occurred_at DESC", "SELECT"),
        ("/* a report */ WITH x AS (SELECT 1) SELECT * FROM x", "WITH"),
        ("SHOW TABLES FROM agentstream", "SHOW"),
        ("DESCRIBE TABLE agentstream.steps", "DESCRIBE"),
        ("desc agentstream.steps", "DESC"),
        ("SELECT 'DROP TABLE x; INSERT' AS text", "SELECT"),  # keywords inside a string are text
        ("SELECT `weird;name` FROM t", "SELECT"),
        ("SELECT 'it''s' AS quoted", "SELECT"),
        ("(SELECT 1) UNION ALL (SELECT 2)", "SELECT"),
    ],
)
def test_read_only_statements_pass(query, first):
    assert check_read_only(query) == first


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("INSERT INTO agentstream.annotations VALUES ('x')", "INSERT is refused"),
        ("DROP TABLE agentstream.trajectories", "DROP is refused"),
        ("drop database agentstream", "DROP is refused"),
        ("'' SELECT 1", "is refused"),
        ("ALTER TABLE agentstream.steps DELETE WHERE 1", "ALTER is refused"),
        ("CREATE TABLE t (x Int8) ENGINE = Memory", "CREATE is refused"),
        ("TRUNCATE TABLE agentstream.steps", "TRUNCATE is refused"),
        ("OPTIMIZE TABLE agentstream.steps FINAL", "OPTIMIZE is refused"),
        ("SYSTEM DROP DNS CACHE", "SYSTEM is refused"),
        ("SET readonly = 0", "SET is refused"),
        ("KILL QUERY WHERE 1", "KILL is refused"),
        ("-- just a comment", "is refused"),
        ("SELECT 1; DROP TABLE agentstream.steps", "one statement only"),
        ("SELECT 1;;SELECT 2", "one statement only"),
        ("SELECT * FROM agentstream.steps INTO OUTFILE '/tmp/x.csv'", "INTO OUTFILE is refused"),
        ("SELECT * FROM file('/etc/passwd', 'LineAsString')", "table function file() is refused"),
        ("SELECT * FROM url('http://example.com', 'CSV')", "table function url() is refused"),
        ("SELECT * FROM remote('h:9000', system.one)", "table function remote() is refused"),
        ("DESCRIBE TABLE executable('x.sh', 'TSV', 'a String')", "table function executable() is refused"),
        ("SELECT 'open", "not closed"),
        ("", "non-empty"),
        ("   ", "non-empty"),
    ],
)
def test_everything_else_is_refused_with_the_reason(query, reason):
    with pytest.raises(McpToolError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        check_read_only(query)


def test_comments_and_quotes_are_blanked_before_checking():
    assert strip_quoted("SELECT 1 # DROP\n") == "SELECT 1 \n"
    assert ";" not in strip_quoted("SELECT ';' /* ; */ -- ;")


def test_select_and_with_are_limited_in_the_engine_others_after_fetching():
    assert limited_text("WITH a AS (SELECT 1) SELECT * FROM a ;", "WITH", 5) == (
        "SELECT * FROM (\nWITH a AS (SELECT 1) SELECT * FROM a\n) LIMIT 6"
    )
    assert limited_text("DESCRIBE t;", "DESCRIBE", 5) == "DESCRIBE t"


def test_server_settings_make_a_clickhouse_server_refuse_writes_and_stop_in_time():
    assert server_settings(2.5, 100) == {
        "readonly": 2,
        "max_execution_time": 2,
        "max_result_rows": 101,
        "result_overflow_mode": "break",
    }
    assert "readonly" not in server_settings(2.5, 100, already_read_only=True)

"""The MCP `sql` tool tried as an attacker would (issue 34, items 4 and 6): a corpus of hostile
queries is refused by ClickHouse's parser or engine and writes nothing; a runaway query is
cancelled by the engine within its limit while the writer's inserts keep their latency."""

from __future__ import annotations

import re
import statistics
import threading
import time

import pytest

from clients.clickhouse.client import connect
from infra.mcp.config import McpConfig
from infra.mcp.data_tools import sql
from tests.support.counting_server import counting_server
from tests.support.db_serve import served_chdb

pytestmark = pytest.mark.integration

TIMEOUT_S = 2  # the endpoint's reader max_execution_time here
OUT = "/tmp/agentstream-hostile-{n}"  # every file a query could write; asserted absent after


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mcp-hostile")
    with served_chdb(tmp, TIMEOUT_S) as url:
        yield url, McpConfig(clickhouse_url=url, sql_max_rows=5, sql_timeout_s=20)


HOSTILE = [
    # several statements, hidden from a word filter by ClickHouse's quoting and comments
    "SELECT $$;$$; CREATE TABLE agentstream.pwn1 (x UInt8) ENGINE = Memory",
    "SELECT $tag$ ' $tag$; DROP TABLE agentstream.steps",
    "SELECT 1 /* ; */; INSERT INTO agentstream.annotations (trajectory_id) VALUES ('x')",
    "SELECT 1 -- comment\n; CREATE TABLE agentstream.pwn2 (x UInt8) ENGINE = Memory",
    "SELECT 1 # hash comment\n; DROP DATABASE agentstream",
    "SELECT 1;;SELECT 2",
    "SELECT '\\''; CREATE TABLE agentstream.pwn3 (x UInt8) ENGINE = Memory; SELECT '",
    # SHOW / DESCRIBE with tricks
    "SHOW TABLES; CREATE TABLE agentstream.pwn4 (x UInt8) ENGINE = Memory",
    "SHOW TABLES INTO OUTFILE '" + OUT.format(n=1) + "'",
    "DESCRIBE TABLE agentstream.steps INTO OUTFILE '" + OUT.format(n=2) + "'",
    "DESCRIBE TABLE file('/etc/passwd', 'LineAsString')",
    # DESCRIBE of a table function opens it to infer the schema (readonly=1 lets it; and see below)
    "DESCRIBE TABLE sqlite('/etc/passwd', 't')",
    "SHOW CREATE TABLE system.users",
    "SHOW GRANTS",
    # table functions, quoted, as tables and as scalars
    "SELECT * FROM `file`('/etc/passwd', 'LineAsString')",
    "SELECT * FROM \"file\"('/etc/passwd', 'LineAsString')",
    "SELECT * FROM `url`('http://127.0.0.1:9/', 'CSV', 'a String')",
    "SELECT * FROM \"s3\"('http://127.0.0.1:9/b/k', 'CSV', 'a String')",
    "SELECT * FROM remote('127.0.0.1', system.one)",
    "SELECT * FROM executable('id', 'TSV', 'a String')",
    "SELECT file('/etc/passwd')",
    "SELECT `file`('/etc/passwd') AS f",
    "SELECT (SELECT \"file\"('/etc/passwd')) AS f",
    "SELECT * FROM agentstream.steps WHERE 1 IN (SELECT 1 FROM `url`('http://127.0.0.1:9/', 'CSV', 'a U8'))",
    "WITH x AS (SELECT * FROM file('/etc/passwd', 'LineAsString')) SELECT * FROM x",
    "SELECT * FROM merge('system', '.*')",
    # writing files
    "SELECT 'x' INTO OUTFILE '" + OUT.format(n=3) + "' FORMAT TSV",
    "SELECT $$x$$ INTO OUTFILE $o$" + OUT.format(n=4) + "$o$ TRUNCATE",
    "(SELECT 1) UNION ALL (SELECT 2) INTO OUTFILE '" + OUT.format(n=5) + "'",
    # settings
    "SELECT 1 SETTINGS readonly = 0",
    "SELECT 1 SETTINGS max_execution_time = 3600, max_memory_usage = 0",
    "SET readonly = 0",
    # secrets in system tables
    "SELECT * FROM system.users",
    "SELECT query FROM system.query_log",
    "SELECT query FROM system.processes",
    "SELECT * FROM system.settings WHERE changed",
    "SELECT name FROM `system`.`users`",
    # format tricks
    "SELECT 1 FORMAT Native",
    # writes and administration
    "INSERT INTO agentstream.annotations (trajectory_id) SELECT 'x'",
    "INSERT INTO FUNCTION file('" + OUT.format(n=6) + "', 'TSV', 'x String') SELECT 'x'",
    "CREATE TABLE agentstream.pwn5 ENGINE = Memory AS SELECT 1",
    "KILL QUERY WHERE 1",
    "SYSTEM FLUSH LOGS",
    "OPTIMIZE TABLE agentstream.steps FINAL",
    "ATTACH TABLE agentstream.pwn6 (x UInt8) ENGINE = Memory",
    "EXCHANGE TABLES agentstream.steps AND agentstream.episodes",
    "RENAME TABLE agentstream.steps TO agentstream.pwn7",
    "ALTER TABLE agentstream.steps DELETE WHERE 1",
    "TRUNCATE TABLE agentstream.steps",
    "DROP TABLE agentstream.steps",
    "USE system",
    "EXPLAIN SELECT 1",
    "  /* tidy up */ DROP TABLE agentstream.trajectories",
]


def _state(url: str):
    client = connect(url)
    try:
        tables = client.query("SELECT name FROM system.tables WHERE database = 'agentstream' ORDER BY name")
        counts = client.query("SELECT count() FROM agentstream.annotations").result_rows
        return [r[0] for r in tables.result_rows], counts
    finally:
        client.close()


# A refusal: the tool's own (McpToolError, "query: ... refused" / "one statement only") or the
# engine's (READONLY, ACCESS_DENIED). A syntax error, an unknown table or a connection error is
# not one: the query was never judged (a typo here, or a server that is down, must fail the test).
REFUSAL = re.compile(
    r"^query: (.*\bis refused\b|one statement only)"
    r"|Code: (164|497)\. DB::Exception"
)


def test_the_hostile_corpus_is_refused_and_writes_nothing(store):
    import os

    url, config = store
    assert len(HOSTILE) >= 30
    before = _state(url)
    not_refused = {}
    for query in HOSTILE:
        try:
            sql(config, query)
        except Exception as exc:  # which exception it is, is what is asserted
            if not REFUSAL.search(str(exc)):
                not_refused[query] = f"{type(exc).__name__}: {str(exc)[:200]}"
            continue
        not_refused[query] = "ran"
    assert not_refused == {}
    assert _state(url) == before  # no table created, dropped or renamed, no row written
    assert [n for n in range(1, 7) if os.path.exists(OUT.format(n=n))] == []


def test_describe_of_a_url_is_refused_without_a_request(store):
    """Found: `DESCRIBE TABLE url(...)` passed as a listing; the engine fetched the URL to infer
    its schema (the column names came back: `secret`, `body`), and `s3` did the same."""
    _, config = store
    with counting_server() as (base, hits):
        for query in (
            f"DESCRIBE TABLE url('{base}/a', 'CSVWithNames')",
            f"DESC url('{base}/b')",
            f"DESCRIBE TABLE s3('{base}/bucket/c', 'CSV')",
        ):
            with pytest.raises(Exception, match="DESCRIBE of a table function or query is refused"):
                sql(config, query)
    assert hits == []
    assert sql(config, "DESCRIBE TABLE agentstream.steps")["row_count"] > 0  # a table's still passes


@pytest.mark.parametrize(
    ("query", "rows"),
    [
        ("SELECT count() AS n FROM agentstream.steps", [{"n": 0}]),
        ("select 'a;b' AS s, $$it's$$ AS d -- a comment", [{"s": "a;b", "d": "it's"}]),
        ("WITH t AS (SELECT number AS n FROM numbers(3)) SELECT sum(n) AS s FROM t", [{"s": 3}]),
        ("SELECT 1 AS x UNION ALL SELECT 2 AS x ORDER BY x", [{"x": 1}, {"x": 2}]),
        ("SELECT count() > 0 AS ok FROM system.columns WHERE database = 'agentstream'", [{"ok": True}]),
        ("SELECT count() AS n FROM steps", [{"n": 0}]),  # bare names are the agentstream database's
    ],
)
def test_legit_selects_pass(store, query, rows):
    _, config = store
    result = sql(config, query)
    assert [{k: (bool(v) if k == "ok" else v) for k, v in r.items()} for r in result["rows"]] == rows


def test_a_runaway_query_is_cancelled_by_the_engine_and_ingestion_keeps_its_latency(store):
    url, config = store
    writer = connect(url, role="writer")
    writer.command(
        "CREATE TABLE IF NOT EXISTS agentstream.latency_probe (x UInt64) ENGINE = MergeTree ORDER BY x"
    )

    def insert_ms(n: int) -> float:
        times = []
        for i in range(n):
            started = time.perf_counter()
            writer.insert("agentstream.latency_probe", [[i]], column_names=["x"])
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)

    normal = insert_ms(8)
    outcome: dict = {}

    def runaway(query: str, key: str) -> None:
        started = time.monotonic()
        try:
            sql(config, query)
            outcome[key] = ("finished", time.monotonic() - started)
        except Exception as exc:
            outcome[key] = (str(exc), time.monotonic() - started)

    slow = threading.Thread(target=runaway, args=("SELECT count() FROM numbers(1e12)", "time"))
    slow.start()
    time.sleep(0.3)
    during = insert_ms(8)
    slow.join(timeout=30)
    runaway("SELECT length(groupArray(number)) AS n FROM numbers(1e9)", "memory")
    writer.close()
    message, elapsed = outcome["time"]
    assert (
        "TIMEOUT_EXCEEDED" in message and elapsed < TIMEOUT_S + 3
    )  # the engine's limit, not the tool's 20 s
    assert during <= 2 * max(normal, 50.0), (normal, during)  # ms, medians; floor: a loaded 2-core host
    assert "MEMORY_LIMIT_EXCEEDED" in outcome["memory"][0]
    assert sql(config, "SELECT 1 AS one")["rows"] == [{"one": 1}]  # the reader session is free again

"""The embedded chDB engine served over ClickHouse HTTP: the same clickhouse-connect code works for
`chdb:///path` and `http://host:port`; migrations are idempotent; the sink rides out an outage."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime

import pytest

from clients.clickhouse.client import chdb_path, connect, live_endpoint
from clients.clickhouse.migrate import load_migrations
from schemas.events import StepRecorded
from tests.support.processes import AGENTSTREAM, Proc, free_port, wait_for
from tests.support.sink_harness import publish, reader, scalar, start_sink

pytestmark = pytest.mark.integration


def _cli(*args: str) -> str:
    out = subprocess.run([*AGENTSTREAM, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _serve(url: str, port: int, log) -> Proc:
    proc = Proc([*AGENTSTREAM, "db", "serve", "--clickhouse-url", url, "--port", str(port)], log)
    wait_for(lambda: live_endpoint(chdb_path(url)), timeout_s=60, what="agentstream db serve")
    return proc


def test_migrate_is_idempotent_and_sql_formats(clickhouse_url, tmp_path):
    if chdb_path(clickhouse_url) is None:
        pytest.skip("embedded-only: serving a chDB path (the docker ClickHouse is a server already)")
    assert "applied migrations: 0001, 0002, 0003, 0004, 0005, 0006" in _cli(
        "db", "migrate", "--clickhouse-url", clickhouse_url
    )
    assert "schema up to date" in _cli(
        "db", "migrate", "--clickhouse-url", clickhouse_url, "--events-ttl-days", "30"
    )
    server = _serve(clickhouse_url, free_port(), tmp_path / "serve.log")
    try:
        # the same command now goes through the serving process instead of opening the locked path
        assert "schema up to date" in _cli("db", "migrate", "--clickhouse-url", clickhouse_url)
        client = connect(clickhouse_url, role="writer")  # a reader may not insert (test_endpoint_security)
        client.insert(
            "agentstream.annotations",
            [["a1", "t1", None, datetime(2026, 1, 2, tzinfo=UTC), "overall", 0.5, "ann", "ok", "test"]],
            column_names=["event_id", "trajectory_id", "step_index", "occurred_at", "rubric", "score",
                          "annotator", "comment", "producer"],
        )  # fmt: skip
        assert client.query(
            "SELECT score FROM agentstream.annotations WHERE step_index IS NULL"
        ).result_rows == [(0.5,)]
        ddl = client.command("SHOW CREATE TABLE agentstream.events")
        assert "TTL toDateTime(occurred_at) + toIntervalDay(30)" in ddl
        versions = client.query("SELECT version FROM agentstream.schema_migrations FINAL ORDER BY version")
        assert versions.result_rows == [(m.version,) for m in load_migrations()]
        query = "SELECT trajectory_id, score FROM agentstream.annotations"
        assert json.loads(_cli("sql", query, "--format", "json", "--clickhouse-url", clickhouse_url)) == [
            {"trajectory_id": "t1", "score": 0.5}
        ]
        assert _cli("sql", query, "--format", "csv", "--clickhouse-url", clickhouse_url).splitlines() == [
            "trajectory_id,score",
            "t1,0.5",
        ]
        bad = "SELECT nope FROM agentstream.annotations"
        failed = subprocess.run(
            [*AGENTSTREAM, "sql", bad, "--clickhouse-url", clickhouse_url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert failed.returncode != 0 and "UNKNOWN_IDENTIFIER" in failed.stderr
        client.close()
    finally:
        server.stop()
    assert live_endpoint(chdb_path(clickhouse_url)) is None  # the endpoint file went with the process


def test_sink_retries_while_clickhouse_is_down(broker, clickhouse_url, tmp_path):
    if chdb_path(clickhouse_url) is None:
        pytest.skip("embedded-only: stops and restarts the process serving chDB")
    port = free_port()
    server = _serve(clickhouse_url, port, tmp_path / "serve1.log")
    # the sink finds the serving process and writes through it over HTTP
    sink = start_sink(broker.bootstrap, clickhouse_url, tmp_path / "sink")
    try:
        when = datetime(2026, 1, 2, tzinfo=UTC)
        steps = [
            StepRecorded(event_id=f"s{i}", trajectory_id="t", occurred_at=when, producer="test", step_index=i)
            for i in range(20)
        ]
        publish(broker.bootstrap, steps[:10])
        client = reader(clickhouse_url)
        wait_for(
            lambda: scalar(client, "SELECT count() FROM agentstream.steps FINAL") == 10, 30, what="10 steps"
        )
        client.close()
        server.stop()  # ClickHouse goes away
        publish(broker.bootstrap, steps[10:])
        wait_for(lambda: "ClickHouse unavailable" in sink.proc.log_text(), 30, what="the sink to retry")
        server = _serve(clickhouse_url, port, tmp_path / "serve2.log")
        client = reader(clickhouse_url)
        wait_for(
            lambda: scalar(client, "SELECT count() FROM agentstream.steps FINAL") == 20, 60, what="20 steps"
        )
        assert scalar(client, "SELECT uniqExact(event_id) FROM agentstream.steps FINAL") == 20
        assert sink.proc.alive()
        client.close()
    finally:
        sink.proc.stop()
        server.stop()

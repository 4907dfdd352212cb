"""`agentstream bench console` for real at a small size: real chDB served on its endpoint, the real
console app over HTTP, the JSON and the table a person reads."""

from __future__ import annotations

import json
import tempfile

from infra.bench.console.measure import server_ms
from infra.bench.console.workload import LONG_ID
from infra.cli.main import main

REPEATS = 3


def test_a_small_run_times_every_page_and_every_query(tmp_path, monkeypatch, capsys):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the bench makes its chDB directory
    out = tmp_path / "console.json"
    argv = ["bench", "console", "--trajectories", "2000", "--steps", "20", "--filler-steps", "1",
            "--repeats", str(REPEATS), "--output", str(out)]  # fmt: skip
    assert main(argv) == 0

    result = json.loads(out.read_text())
    assert result["benchmark"] == "console"
    rows = {row["page"]: row for row in result["rows"]}
    assert list(rows) == ["list", "filtered", "page 40", "trajectory (20 steps)"]
    assert rows["list"]["shown"] == 50  # a full first page of trajectory rows
    assert rows["page 40"]["shown"] == 50  # 2,000 trajectories: page 40 is the last full one
    assert rows["trajectory (20 steps)"]["shown"] == 20  # every step of the long trajectory rendered
    for row in rows.values():
        for key in ("cold server ms", "server p50 ms", "server p95 ms", "server max ms", "client p50 ms"):
            assert row[key] > 0, (row["page"], key)
        assert row["client p50 ms"] >= row["server p50 ms"]  # the client waits for the server
        assert row["p95 < 300 ms"] == ("met" if row["server p95 ms"] < 300 else "not met")
    assert result["target"]["met"] == all(r["p95 < 300 ms"] == "met" for r in rows.values())
    for page, raw in result["raw"].items():
        assert len(raw["server_ms"]) == len(raw["client_ms"]) == REPEATS, page
        assert raw["cold"]["server_ms"] > 0

    queries = {(q["page"], q["query"]): q for q in result["queries"]}
    assert queries[("trajectory (20 steps)", "detail steps")]["rows"] == 20
    assert queries[("list", "list")]["rows"] == 50
    assert all(q["p50 ms"] > 0 for q in queries.values())
    assert result["setup"]["rows"]["trajectories"] == 2000 + 400 + 1  # + earlier revisions + the long one
    assert result["setup"]["rows"]["steps"] == 2000 + 20

    printed = capsys.readouterr().out
    assert "| page " in printed and "p95 < 300 ms" in printed and LONG_ID not in printed
    assert list(scratch.iterdir()) == []  # the chDB directory is gone


def test_server_timing_is_read_from_the_app_metric():
    assert server_ms("db;dur=3, app;dur=41.5") == 41.5
    assert server_ms("app") != server_ms("app")  # nan: no duration given

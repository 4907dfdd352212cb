"""`agentstream bench e2e` with tiny settings, end to end on a real embedded stack (broker, scoring
role, sink into chDB, batch builder as supervised processes, agents recording through the SDK): each rate's
row has the latencies and, beside them, the CPU seconds per 1,000 steps of every process, as medians
over `--repeats` runs; `bench readme` turns that JSON into the README's table. The figures themselves
are not asserted (the machines are noisy)."""

from __future__ import annotations

import json

import pytest

from infra.bench.readme import END, START, SUMMARY_END, SUMMARY_START
from infra.cli.main import main

pytestmark = pytest.mark.integration

PROCESSES = ("broker", "scoring", "sink", "batch")


def test_each_rate_reports_latencies_and_every_process_cpu_over_its_runs(tmp_path, capsys):
    out, plot = tmp_path / "e2e.json", tmp_path / "e2e.png"
    args = ["--rates", "40", "--duration", "3", "--repeats", "2", "--processes", "1", "--idle", "1"]
    assert main(["bench", "e2e", *args, "--output", str(out), "--plot", str(plot)]) == 0
    document = json.loads(out.read_text())
    assert document["repeats"] == 2
    (row,) = document["rows"]
    assert row["offered steps/s"] == 40.0 and row["runs"] == 2 and row["all in CH"] is True
    for stage in ("rule", "trajectory"):
        assert 0 < row[f"{stage} p50 ms"] <= row[f"{stage} p99 ms"], stage
    (cpu,) = document["cpu_s_per_1k_steps"]
    assert all(cpu[name] > 0 for name in (*PROCESSES, "stack", "agents (SDK)")), cpu
    assert len(cpu["stack per run"]) == 2 and all(run > 0 for run in cpu["stack per run"])
    assert min(cpu["stack per run"]) <= cpu["stack"] <= max(cpu["stack per run"])
    assert all(document["idle_cpu_ms_per_s"][name] is not None for name in PROCESSES)
    printed = capsys.readouterr().out
    assert "| 40 " in printed and "run 1 of 2)" in printed and "run 2 of 2)" in printed

    readme, benchmarks = tmp_path / "README.md", tmp_path / "benchmarks.md"
    readme.write_text(f"# x\n{SUMMARY_START}\n{SUMMARY_END}\n")
    benchmarks.write_text(f"# x\n{START}\n{END}\n")
    none = str(tmp_path / "absent.json")
    command = ["bench", "readme", "--e2e", str(out), "--produce", none, "--baseline", none]
    assert main([*command, "--readme", str(readme), "--benchmarks", str(benchmarks)]) == 0
    text = benchmarks.read_text()
    assert "| 40 | " in text and "median of 2 runs" in text
    assert "| 40 | " in readme.read_text() and "medians of 2 runs" in readme.read_text()

"""`agentstream bench rollout` with tiny settings: it runs end to end (embedded broker, the real
policy server, the rollout driver recording every step, the local sandbox) and writes every figure
the issue asks for. The figures themselves are not asserted (the machines are noisy)."""

from __future__ import annotations

import json

import pytest

from infra.cli.main import main

pytestmark = pytest.mark.integration

TINY = ["--repeats", "1", "--concurrency", "1,2", "--group-size", "1", "--max-turns", "2"]
TINY += ["--max-tokens", "4", "--sandbox-calls", "5"]


def test_the_rollout_benchmark_writes_episode_rates_and_sandbox_overhead(tmp_path, capsys):
    out = tmp_path / "rollout.json"
    assert main(["bench", "rollout", *TINY, "--output", str(out)]) == 0
    document = json.loads(out.read_text())
    rollouts = [row for row in document["rows"] if row["case"] == "rollout calc"]
    assert [r["concurrency"] for r in rollouts] == [1, 2]
    assert all(r["episodes"] == 8 and r["steps"] >= 8 for r in rollouts)  # 8 calc tasks, >= 1 turn each
    assert all(r["episodes_per_s"] > 0 and r["steps_per_s"] >= r["episodes_per_s"] for r in rollouts)
    assert set(document["rollout"]) == {"1", "2"}
    assert set(document["rollout"]["1"]) == {"episodes_per_s", "steps_per_s"}

    sandbox = document["sandbox"]
    assert sandbox["calls"] == 5
    for key in ("p50_ms", "p99_ms"):
        assert sandbox[key]["sandbox"] > 0 and sandbox[key]["bare"] > 0, key
    assert sandbox["ratio_p50"] == pytest.approx(sandbox["p50_ms"]["sandbox"] / sandbox["p50_ms"]["bare"])
    table = capsys.readouterr().out
    for case in (
        "| rollout calc",
        "| sandbox: LocalSandbox shell true",
        "| sandbox: bare subprocess",
        f"JSON: {out}",
    ):
        assert case in table, case

"""`agentstream bench rollout` with tiny settings, through the real command: calc rollouts (embedded
broker, the real policy server, the driver recording every step), the tool-call cost of each sandbox
backend against a bare `subprocess.run`, coding episodes whose verdicts must be True, and the engine
set-up rows. The figures themselves are not asserted (the machines are noisy); that every row is
there with numbers, and says why where a backend could not be had, is."""

from __future__ import annotations

import json
import math

import pytest

from infra.bench.sandbox_rollout import BenchFailure, play_episode
from infra.cli.main import main
from producers.envs.tasks import Task, builtin_tasks

pytestmark = pytest.mark.integration

CALC = [
    "--repeats",
    "1",
    "--concurrency",
    "1,2",
    "--group-size",
    "1",
    "--max-turns",
    "2",
    "--max-tokens",
    "4",
]
SANDBOX = ["--sandbox-calls", "5", "--coding-episodes", "1", "--coding-concurrency", "1", "--no-engine-cold"]


def _number(value) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


def _run(tmp_path, *options: str) -> dict:
    out = tmp_path / "rollout.json"
    assert main(["bench", "rollout", *options, "--output", str(out)]) == 0
    return json.loads(out.read_text())


def test_calc_rows_and_the_local_sandbox_with_docker_out_of_reach(tmp_path, capsys):
    nowhere = f"unix://{tmp_path}/no-engine.sock"
    document = _run(tmp_path, *CALC, *SANDBOX, "--docker-host", nowhere)

    rollouts = [row for row in document["rows"] if row["case"] == "rollout calc"]
    assert [r["concurrency"] for r in rollouts] == [1, 2]
    assert all(r["episodes"] == 8 and r["steps"] >= 8 for r in rollouts)  # 8 calc tasks, >= 1 turn each
    assert all(r["episodes_per_s"] > 0 and r["steps_per_s"] >= r["episodes_per_s"] for r in rollouts)
    assert set(document["rollout"]) == {"1", "2"}

    sides = document["sandbox"]["tool_calls"]["sides"]
    assert set(sides) == {"local", "bare"}
    assert all(_number(sides[s][k]) for s in sides for k in ("p50_ms", "p99_ms", "p50_ratio", "p99_ratio"))
    assert sides["local"]["p50_ratio"] == pytest.approx(sides["local"]["p50_ms"] / sides["bare"]["p50_ms"])
    assert sides["local"]["target"] == ("met" if sides["local"]["p50_ms"] < 5 else "missed")
    assert sides["local"]["isolation"]["backend"] == "local"
    local = document["sandbox"]["coding"]["local"]["1"]
    assert local["episodes"] == local["passed"] == 1 and _number(local["episodes_per_s"])

    why = document["sandbox"]["unavailable"]["docker"]
    assert "no-engine.sock" in why, why  # the docker rows say why, and the local ones still ran
    assert "docker" not in document["sandbox"]["coding"]
    docker_rows = [r for r in document["tool_call_rows"] if r["side"].startswith("docker")]
    assert [r["note"] for r in docker_rows] == [why] and docker_rows[0]["p50_ms"] is None
    assert [r["note"] for r in document["coding_rows"] if r["backend"] == "docker"] == [why]
    assert [r["setup"] for r in document["setup_rows"]] == ["cold", "warm"]
    assert all("not measured" in r["note"] and r["total_s"] is None for r in document["setup_rows"])

    table = capsys.readouterr().out
    for text in (
        "| rollout calc",
        "| local sandbox shell true",
        "| bare subprocess.run true",
        f"JSON: {tmp_path}",
    ):
        assert text in table, text


@pytest.mark.engine
def test_both_backends_report_tool_calls_and_coding_episodes_with_true_verdicts(tmp_path, sandbox_engine):
    engine = ["--docker-host", sandbox_engine.docker_host, "--sandbox-image", sandbox_engine.image]
    document = _run(tmp_path, "--no-calc", *SANDBOX, *engine)

    assert document["rows"] == [] and document["sandbox"]["unavailable"] == {}
    sides = document["sandbox"]["tool_calls"]["sides"]
    assert set(sides) == {"local", "docker", "bare"}
    for name in ("local", "docker"):
        side = sides[name]
        assert all(_number(side[k]) for k in ("p50_ms", "p99_ms", "p50_ratio", "p99_ratio")), side
        assert side["target"] in ("met", "missed") and side["isolation"]["missing"] == [], side
    assert sides["docker"]["target_p50_ms"] == 150.0 and sides["local"]["target_p50_ms"] == 5.0
    rows = document["tool_call_rows"]
    assert [r["side"].split()[0] for r in rows] == ["local", "docker", "bare"]
    assert all(_number(r["p50_ms"]) and _number(r["p99_ms"]) for r in rows)

    for backend in ("local", "docker"):
        level = document["sandbox"]["coding"][backend]["1"]
        assert level["episodes"] == level["passed"] == 1, (backend, level)  # verdict True
        assert all(_number(level[k]) for k in ("episodes_per_s", "episode_p50_s", "verdict_p50_s")), level
    assert [r["backend"] for r in document["coding_rows"]] == ["local", "docker"]
    assert document["sandbox"]["docker"]["config"]["docker_host"] == sandbox_engine.docker_host
    assert all("not set up by this run" in r["note"] for r in document["setup_rows"])


def test_an_episode_whose_verdict_is_not_true_stops_the_bench():
    shipped = builtin_tasks("sandbox")[0]
    path = sorted(shipped.task["files"])[0]
    lines = shipped.task["files"][path].splitlines()  # a line added at the end: applies, fixes nothing
    harmless = f"--- a/{path}\n+++ b/{path}\n@@ -{len(lines)} +{len(lines)},2 @@\n {lines[-1]}\n+# no fix\n"
    task = Task(shipped.task_id, shipped.env, {**shipped.task, "reference_patch": harmless}, shipped.domain)
    with pytest.raises(BenchFailure, match="verdict on the reference fix is False"):
        play_episode({"backend": "local"}, task)
    assert play_episode({"backend": "local"}, shipped)["verdict"] is True

"""`agentstream bench learn` CI-sized, through the real command: two seeds and a control, each the
whole loop (embedded stack, policy server, executor, rollouts) for one version, on a warm start too
small to solve anything (so groups with equal rewards are kept: `--no-drop-zero-std`). The figures are
not the point here; the outputs' structure and their consistency with each other are: every run
evaluated version 0 and v1 on the held-out and the harder tasks, gains are the differences they
claim, the means leave the control out, the control's executor trained at the control's learning rate,
the seeds' warm starts differ and the control reuses its seed's from the cache."""

from __future__ import annotations

import json
import statistics

import pytest

from infra.cli.main import main
from infra.learn.loop import CONTROL_LEARNING_RATE, LearnConfig

pytestmark = pytest.mark.integration

HELDOUT, SAMPLES = 4, 1
OPTIONS = [
    "--seeds", "0,1", "--control", "--budget-min", "2", "--versions", "1",
    "--heldout", str(HELDOUT), "--eval-samples", str(SAMPLES), "--hard-difficulty", "2",
    "--group-size", "4", "--batch-trajectories", "8", "--no-drop-zero-std",
    "--warm-steps", "10", "--warm-hidden-size", "32", "--warm-layers", "1",
]  # fmt: skip


def _check_figures(figures: dict) -> None:
    assert figures["episodes"] == HELDOUT * SAMPLES and figures["greedy_episodes"] == HELDOUT
    assert figures["success"] == round(figures["successes"] / figures["episodes"], 4)
    assert figures["greedy_success"] == round(figures["greedy_successes"] / HELDOUT, 4)


@pytest.mark.timeout(420)
def test_two_seeds_and_a_control_report_consistent_figures(tmp_path, capsys):
    out = tmp_path / "learn.json"
    assert main(["bench", "learn", *OPTIONS, "--data-dir", str(tmp_path / "data"), "--output", str(out)]) == 0
    document = json.loads(out.read_text())
    runs = document["runs"]
    assert list(runs) == ["seed 0", "seed 1", "control"]
    assert [row["run"] for row in document["rows"]] == list(runs)

    for name, run in runs.items():
        points = run["points"]
        assert [p["version"] for p in points] == ["base", "v1"], name
        # minutes count from version 0; v1's evaluation started within the 2-minute budget
        assert points[0]["minutes"] == 0.0 and 0 < points[1]["minutes"] < 3.0, points
        for point in points:
            _check_figures(point)
        assert run["final_version"] == "v1" and run["final_success"] == points[-1]["success"]
        assert run["gain_points"] == round(100 * (points[1]["success"] - points[0]["success"]), 1)
        assert run["greedy_gain_points"] == round(
            100 * (points[1]["greedy_success"] - points[0]["greedy_success"]), 1
        )
        assert run["harder"]["difficulty"] == 2 and run["harder"]["final"]["version"] == "v1"
        _check_figures(run["harder"]["v0"])
        _check_figures(run["harder"]["final"])
        pairs = run["final_vs_v0"]
        assert (pairs["a"], pairs["b"], pairs["pairs"]) == ("v1", "base", HELDOUT * SAMPLES)
        assert pairs["difference"] == pytest.approx(run["final_success"] - run["v0_success"])
        assert run["curve_png"].endswith("learning_curve.png")

    # the control: its seed's warm start (a cache hit), the control's learning rate in the executor
    assert runs["control"]["config"]["seed"] == 0 and runs["control"]["config"]["control"] is True
    assert runs["control"]["points"][1]["learning_rate"] == CONTROL_LEARNING_RATE
    assert runs["seed 0"]["points"][1]["learning_rate"] == LearnConfig().learning_rate
    assert runs["control"]["warm_start"] == runs["seed 0"]["warm_start"] != runs["seed 1"]["warm_start"]
    logged = capsys.readouterr().out
    assert logged.count("warm start: cache hit") == 1 and logged.count("warm start: cached as") == 2

    gains = [runs[name]["gain_points"] for name in ("seed 0", "seed 1")]
    assert document["mean_gain_points"]["n"] == 2
    assert document["mean_gain_points"]["mean"] == pytest.approx(statistics.fmean(gains), abs=0.01)
    low, high = document["mean_gain_points"]["low"], document["mean_gain_points"]["high"]
    assert low <= document["mean_gain_points"]["mean"] <= high
    assert document["control_gain_points"] == runs["control"]["gain_points"]
    assert document["reached_20_points"]["of"] == 2
    png = tmp_path / "learn.png"
    assert document["curve_png"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

"""`agentstream bench learn`'s options and progress, the loop itself faked (no model, no broker): a bad
option is one line naming it before any run starts, and each run is saved, whole, as it ends, so a
kill loses only the run in progress."""

from __future__ import annotations

import json

import pytest

import infra.learn.loop as loop
from infra.cli.main import main


def fake_summary(seed: int) -> dict:
    return {
        "points": [{"minutes": 0.0, "success": 0.2, "greedy_success": None}],
        "final_version": "v1",
        "v0_success": 0.2,
        "final_success": 0.2 + seed / 10,
        "gain_points": 10.0 * seed,
        "v0_greedy_success": None,
        "final_greedy_success": None,
        "greedy_gain_points": None,
        "minutes_to_20_points": None,
        "minutes": 0.1,
        "final_vs_v0": {},
        "harder": {},
    }


@pytest.fixture
def played(monkeypatch) -> list:
    """The runs started; the third one is killed (KeyboardInterrupt, as Ctrl-C)."""
    started = []

    def run_learning(config, run_dir, cache):
        started.append((config.seed, config.control))
        if len(started) == 3:
            raise KeyboardInterrupt
        return fake_summary(config.seed)

    monkeypatch.setattr(loop, "run_learning", run_learning)
    return started


def bench(tmp_path, *extra: str) -> list[str]:
    return ["bench", "learn", "--data-dir", str(tmp_path / "data"), "--warm-steps", "1", *extra]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budget-min", "nan"], "--budget-min: must be a finite number > 0, got nan"),
        (["--budget-min", "inf"], "--budget-min: must be a finite number > 0, got inf"),
        (["--budget-min", "0"], "--budget-min: must be a finite number > 0, got 0.0"),
        (["--seeds", "0,-1"], "--seeds: each seed must be from 0 to 2147483647, got -1"),
        (["--seeds", "2147483648"], "--seeds: each seed must be from 0 to 2147483647, got 2147483648"),
        (["--seeds", "1,1"], "--seeds: expected distinct integers"),
        (["--hard-difficulty", "9"], "--hard-difficulty: must be from 0 (none) to 5, got 9"),
        (["--output", "{tmp}"], "--output='{tmp}': is a directory"),
        (["--output", "{tmp}/file.txt/learn.json"], "--output='{tmp}/file.txt/learn.json': its directory"),
    ],
)
def test_a_bad_option_is_one_line_before_any_run(tmp_path, capsys, played, extra, message):
    (tmp_path / "file.txt").write_text("")
    argv = bench(tmp_path, *[part.format(tmp=tmp_path) for part in extra])
    assert main(argv) == 1
    assert message.format(tmp=tmp_path) in capsys.readouterr().err
    assert played == []


def test_each_finished_run_is_saved_whole_before_the_next_starts(tmp_path, played):
    output = tmp_path / "out" / "learn.json"
    # the third run (the control) is killed: Ctrl-C, exit 130
    assert main(bench(tmp_path, "--seeds", "0,1", "--output", str(output))) == 130
    assert played == [(0, False), (1, False), (0, True)]
    so_far = json.loads(output.read_text())
    assert so_far["partial"] is True and so_far["runs_done"] == ["seed 0", "seed 1"]
    assert so_far["runs_planned"] == ["seed 0", "seed 1", "control"]
    assert so_far["mean_gain_points"]["mean"] == 5.0 and so_far["control_gain_points"] is None
    assert so_far["notes"][0] == "partial: 2 of 3 runs done"
    seed_1 = json.loads((tmp_path / "out" / "learn-seed-1.json").read_text())
    assert seed_1["run"] == "seed 1" and seed_1["gain_points"] == 10.0
    # the finished runs' files and the summary; no temp file, nothing of the killed run
    assert sorted(p.name for p in output.parent.iterdir()) == [
        "learn-seed-0.json",
        "learn-seed-1.json",
        "learn.json",
    ]

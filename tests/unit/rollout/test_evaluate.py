"""`agentstream eval`: each endpoint's sampled and greedy episodes (the rollout driver's runner, faked
here: no policy server, no broker), the per-policy figures, the Holm-corrected paired tests of three
policies, the JSON report, and one-line errors."""

from __future__ import annotations

import json

import pytest

import producers.envs  # noqa: F401  (registers calc)
from infra.cli.main import main
from infra.commands import evaluate as command
from producers.envs.tasks import builtin_tasks
from producers.rollout.driver import EpisodeResult, RolloutConfig
from producers.rollout.evaluate import evaluate


def played(tasks, per_task: int, solved) -> list[EpisodeResult]:
    """The driver's order: task by task, sample j with seed j; `solved(task_index, j)`."""
    return [
        EpisodeResult(
            t.task_id, "g", f"tr-{i}-{j}", solved(i, j), 1, False, seed=j, reward=float(solved(i, j))
        )
        for i, t in enumerate(tasks)
        for j in range(per_task)
    ]


def test_each_endpoint_gets_sampled_episodes_then_one_greedy_episode_per_task():
    calls = []

    def runner(config, tasks, recorder):
        calls.append((config.policy_url, config.group_size, config.temperature, config.forever, recorder))
        return []

    config = RolloutConfig(group_size=3, temperature=0.8, forever=True)
    out = evaluate(config, ["http://a/v1", "http://b/v1"], ["t1"], "rec", runner)
    assert calls == [
        ("http://a/v1", 3, 0.8, False, "rec"),
        ("http://a/v1", 1, 0.0, False, "rec"),
        ("http://b/v1", 3, 0.8, False, "rec"),
        ("http://b/v1", 1, 0.0, False, "rec"),
    ]
    assert [p.policy_url for p in out] == ["http://a/v1", "http://b/v1"]
    calls.clear()
    evaluate(config, ["http://a/v1"], ["t1"], "rec", runner, greedy=False)
    assert calls == [("http://a/v1", 3, 0.8, False, "rec")]


class FakeRecorder:
    def __init__(self):
        self.closed = False

    def close(self, timeout=None):
        self.closed = True


SKILL = {"good": lambda i, j: True, "fair": lambda i, j: j % 2 == 0, "bad": lambda i, j: False}


def fake_eval(monkeypatch, seen: list):
    recorder = FakeRecorder()

    def runner(config, tasks, rec):
        name = config.policy_url.split("//")[1].split("/")[0]
        seen.append((name, config.group_size, config.temperature))
        return played(tasks, config.group_size, SKILL[name])

    monkeypatch.setattr(command, "_runner", lambda: runner)
    monkeypatch.setattr(command, "_recorder", lambda args, model: recorder)
    return recorder


def test_three_policies_print_figures_and_holm_corrected_paired_tests(monkeypatch, capsys, tmp_path):
    seen: list = []
    recorder = fake_eval(monkeypatch, seen)
    urls = [u for name in ("good", "fair", "bad") for u in ("--policy-url", f"http://{name}/v1")]
    report = tmp_path / "eval.json"
    argv = ["eval", "--env", "calc", *urls, "--episodes-per-task", "4", "--bootstrap-resamples", "500"]
    assert main([*argv, "--json", str(report)]) == 0
    tasks = len(builtin_tasks("calc"))
    n = tasks * 4
    assert seen == [(name, size, t) for name in ("good", "fair", "bad") for size, t in ((4, 1.0), (1, 0.0))]
    assert recorder.closed
    out = capsys.readouterr().out
    assert f"http://good/v1: {n}/{n} solved, success rate 1.000" in out
    assert f"http://fair/v1: {n // 2}/{n} solved, success rate 0.500" in out
    assert f"greedy {tasks}/{tasks} = 1.000" in out and "pass@1 0.500, pass@4 1.000" in out
    pairs = [line for line in out.splitlines() if line.startswith("[eval] difference")]
    assert len(pairs) == 3 and "http://good/v1 - http://fair/v1" in pairs[0]
    data = json.loads(report.read_text())
    by_pair = {(c["a"], c["b"]): c for c in data["pairs"]}
    good_bad = by_pair[("http://good/v1", "http://bad/v1")]
    # every one of the n pairs is discordant for good: p = 2 * 0.5**n, Holm multiplies the smallest by 3
    assert good_bad["a_only"] == n and good_bad["b_only"] == 0
    assert good_bad["mcnemar_p"] == pytest.approx(2 * 0.5**n)
    assert (
        good_bad["holm_p"] == pytest.approx(3 * 2 * 0.5**n) and good_bad["verdict"] == "http://good/v1 better"
    )
    assert f"Holm-adjusted p = {good_bad['holm_p']:.4g}" in pairs[1]
    assert good_bad["reward_difference"] == 1.0 and good_bad["reward_low"] == 1.0
    assert [p["pass_at"] for p in data["policies"]] == [
        {"1": 1.0, "4": 1.0},
        {"1": 0.5, "4": 1.0},
        {"1": 0.0, "4": 0.0},
    ]
    assert len(data["outcomes"]["http://bad/v1"]) == n + tasks


def test_the_same_endpoint_twice_is_named_apart_and_never_significant(monkeypatch, capsys):
    fake_eval(monkeypatch, [])
    argv = ["eval", "--env", "calc", "--policy-url", "http://fair/v1", "--policy-url", "http://fair/v1"]
    assert main([*argv, "--no-greedy", "--bootstrap-resamples", "200"]) == 0
    out = capsys.readouterr().out
    assert "http://fair/v1 - http://fair/v1#2" in out and "no significant difference" in out
    assert "greedy off" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--policy-url"),
        (["--policy-url", "http://a/v1", "--pass-k", "5"], "--pass-k='5'"),
        (["--policy-url", "http://a/v1", "--pass-k", "x"], "--pass-k='x'"),
        (["--policy-url", "http://a/v1", "--alpha", "1.5"], "--alpha=1.5"),
        (["--policy-url", "http://a/v1", "--episodes-per-task", "0"], "--episodes-per-task=0"),
    ],
)
def test_bad_requests_are_one_line_errors(capsys, extra, message):
    assert main(["eval", "--env", "calc", *extra]) != 0
    assert message in capsys.readouterr().err


def _calc_tasks_file(tmp_path) -> str:
    path = tmp_path / "calc.jsonl"
    path.write_text(json.dumps({"task_id": "c1", "env": "calc", "task": {"expression": "1 + 1"}}) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--bootstrap-resamples", "1000000000000"],
            "--bootstrap-resamples=1000000000000: must be between 1",
        ),
        (["--bootstrap-resamples", "0"], "--bootstrap-resamples=0"),
        (["--bootstrap-seed", "-1"], "--bootstrap-seed=-1"),
        (["--alpha", "nan"], "--alpha=nan"),
        (["--alpha", "0"], "--alpha=0.0"),
        (["--temperature", "inf"], "--temperature=inf"),
        (["--temperature", "-0.5"], "--temperature=-0.5"),
        (["--concurrency", "0"], "--concurrency=0"),
        (["--max-tokens", "0"], "--max-tokens=0"),
        (["--pass-k", "0,2"], "--pass-k='0,2'"),
        (["--pass-k", "1,,2"], "--pass-k='1,,2'"),
        (["--json", "{tmp}/missing/eval.json"], "--json='{tmp}/missing/eval.json': directory"),
        (["--json", "{tmp}"], "--json='{tmp}': is a directory"),
        (["--json", "{tmp}/file.txt/eval.json"], "'{tmp}/file.txt' is not a directory"),
        (["--env", "echo", "--tasks", "{calc}"], "--env='echo': no task of this env in --tasks='{calc}'"),
        (["--env", "nope"], "--env='nope': no built-in task file 'nope'"),
    ],
)
def test_a_bad_option_fails_before_any_episode_is_played(monkeypatch, capsys, tmp_path, extra, message):
    seen: list = []
    fake_eval(monkeypatch, seen)
    (tmp_path / "file.txt").write_text("")
    calc = _calc_tasks_file(tmp_path)
    extra = [part.format(tmp=tmp_path, calc=calc) for part in extra]
    argv = ["eval", "--env", "calc", "--policy-url", "http://good/v1", "--episodes-per-task", "2", *extra]
    assert main(argv) == 1
    assert message.format(tmp=tmp_path, calc=calc) in capsys.readouterr().err
    assert seen == []  # nothing was played


def test_tasks_of_other_envs_are_left_out_with_a_note_and_the_json_is_written_whole(
    monkeypatch, capsys, tmp_path
):
    seen: list = []
    fake_eval(monkeypatch, seen)
    mixed = tmp_path / "mixed.jsonl"
    rows = [
        {"task_id": "c1", "env": "calc", "task": {"expression": "1 + 1"}},
        {"task_id": "e1", "env": "echo"},
    ]
    mixed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = tmp_path / "out" / "eval.json"
    report.parent.mkdir()
    report.write_text("an earlier report")
    argv = ["eval", "--env", "calc", "--tasks", str(mixed), "--policy-url", "http://good/v1"]
    assert main([*argv, "--episodes-per-task", "2", "--no-greedy", "--json", str(report)]) == 0
    assert "1 task(s) of other envs left out" in capsys.readouterr().out
    data = json.loads(report.read_text())
    assert {o["task_id"] for o in data["outcomes"]["http://good/v1"]} == {"c1"}
    assert sorted(p.name for p in report.parent.iterdir()) == ["eval.json"]  # no temp file left behind

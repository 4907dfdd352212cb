"""`agentstream eval`: the Wilson interval and tally (pure), the two-policy comparison through the
leaderboard's test, and the command wiring with a fake episode runner (no policy server, no broker)."""

from __future__ import annotations

import math

import pytest

import producers.envs  # noqa: F401  (registers calc)
from infra.cli.main import main
from infra.commands import evaluate as command
from producers.envs.tasks import builtin_tasks
from producers.rollout.driver import EpisodeResult, RolloutConfig
from producers.rollout.evaluate import evaluate, score, wilson_interval


def results(solved: int, failed: int) -> list[EpisodeResult]:
    return [EpisodeResult("t", "g", f"tr-{i}", i < solved, 1, False) for i in range(solved + failed)]


def test_wilson_interval_matches_the_textbook_values_and_stays_in_0_1():
    low, high = wilson_interval(8, 10)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    assert wilson_interval(0, 20)[0] == 0.0 and 0.15 < wilson_interval(0, 20)[1] < 0.17
    assert wilson_interval(20, 20)[1] == 1.0 and 0.83 < wilson_interval(20, 20)[0] < 0.85
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    with pytest.raises(ValueError, match="successes=11"):
        wilson_interval(11, 10)


def test_more_episodes_narrow_the_interval_around_the_same_rate():
    small, large = wilson_interval(5, 10), wilson_interval(50, 100)
    assert small[0] < large[0] < 0.5 < large[1] < small[1]


def test_each_endpoint_gets_the_task_set_episodes_per_task_times():
    calls = []

    def runner(config, tasks, recorder):
        calls.append((config.policy_url, config.group_size, len(tasks), recorder))
        return results(3, 1) if config.policy_url == "http://a/v1" else results(1, 3)

    scores = evaluate(
        RolloutConfig(group_size=2), ["http://a/v1", "http://b/v1"], ["t1", "t2"], "rec", runner
    )
    assert calls == [("http://a/v1", 2, 2, "rec"), ("http://b/v1", 2, 2, "rec")]
    assert [(s.policy_url, s.successes, s.episodes, s.rate) for s in scores] == [
        ("http://a/v1", 3, 4, 0.75),
        ("http://b/v1", 1, 4, 0.25),
    ]


def test_two_policies_are_compared_with_the_leaderboard_welch_test():
    from scipy import stats

    a, b = score("a", results(18, 2)), score("b", results(6, 14))
    comparison = command.compare([a, b])
    expected = stats.ttest_ind(list(a.outcomes), list(b.outcomes), equal_var=False).pvalue
    assert comparison["p_value"] == pytest.approx(expected) and comparison["p_value"] < 0.05
    assert comparison["significant"] is True and comparison["difference"] == pytest.approx(0.6)
    same = command.compare([score("a", results(5, 5)), score("b", results(5, 5))])
    assert same["significant"] is False and same["p_value"] == pytest.approx(1.0)
    assert command.compare([a]) is None
    # all-failures on both sides: no variance, no p-value, never "significant"
    flat = command.compare([score("a", results(0, 4)), score("b", results(0, 4))])
    assert math.isnan(flat["p_value"]) and flat["significant"] is False


class FakeRecorder:
    def __init__(self):
        self.closed = False

    def close(self, timeout=None):
        self.closed = True


def test_the_eval_command_prints_rates_intervals_and_the_p_value(monkeypatch, capsys):
    seen, recorder = [], FakeRecorder()

    def runner(config, tasks, rec):
        seen.append((config.policy_url, config.group_size, config.env, {t.env for t in tasks}))
        n = len(tasks) * config.group_size
        return results(n, 0) if config.policy_url.endswith("good/v1") else results(0, n)

    monkeypatch.setattr(command, "_runner", lambda: runner)
    monkeypatch.setattr(command, "_recorder", lambda args, model: recorder)
    argv = ["eval", "--env", "calc", "--policy-url", "http://good/v1", "--policy-url", "http://bad/v1"]
    assert main([*argv, "--episodes-per-task", "3"]) == 0
    tasks = len(builtin_tasks("calc"))
    assert seen == [("http://good/v1", 3, "calc", {"calc"}), ("http://bad/v1", 3, "calc", {"calc"})]
    assert recorder.closed
    out = capsys.readouterr().out
    assert f"http://good/v1: {tasks * 3}/{tasks * 3} solved, success rate 1.000" in out
    assert f"http://bad/v1: 0/{tasks * 3} solved, success rate 0.000" in out
    assert "95% Wilson CI" in out and "difference +1.000" in out and "welch_t" in out


def test_eval_without_an_endpoint_is_a_one_line_error(capsys):
    assert main(["eval", "--env", "calc"]) != 0
    assert "--policy-url" in capsys.readouterr().err

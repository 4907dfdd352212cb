"""`infra.learn.heldout.evaluate`, the in-process side of the one evaluation path: sampled episodes
with fixed seeds (the same for every version, so two versions pair up), one greedy episode per task at
temperature 0, and the outcomes the shared statistics read. A scripted engine stands in for the model."""

from __future__ import annotations

from dataclasses import dataclass

from infra.evaluation.outcomes import compare_pair
from infra.learn.heldout import evaluate


@dataclass
class Sample:
    text: str


class ScriptedEngine:
    """Submits `answer` at once; remembers each request's temperature and seed."""

    def __init__(self, version: str, answer: str, greedy_answer: str | None = None):
        self.version, self.answer, self.greedy_answer = version, answer, greedy_answer
        self.calls: list[tuple[float, int]] = []

    def render(self, messages, tools):
        return messages

    def generate(self, prompt, params):
        self.calls.append((params.temperature, params.seed))
        if params.temperature == 0.0 and self.greedy_answer is not None:
            return [Sample(self.greedy_answer)]
        return [Sample(self.answer)]


def test_sampled_and_greedy_episodes_with_outcomes_paired_across_versions():
    expressions = ("2 + 2", "3 + 3", "1 + 3")
    good = ScriptedEngine("v1", "4", greedy_answer="6")
    score = evaluate(good, expressions, 2, 1.0, 3, seed=10)
    assert (score.version, score.episodes, score.successes) == ("v1", 6, 4)
    assert (score.greedy_episodes, score.greedy_successes, score.greedy_rate) == (3, 1, 1 / 3)
    assert score.rate == 4 / 6 and len(score.outcomes) == 9
    sampled_seeds = [s for t, s in good.calls if t == 1.0]
    assert sampled_seeds == [10, 11, 1010, 1011, 2010, 2011]
    assert [t for t, _ in good.calls].count(0.0) == 3
    bad = ScriptedEngine("v2", "0")
    worse = evaluate(bad, expressions, 2, 1.0, 3, seed=10)
    assert [s for t, s in bad.calls if t == 1.0] == sampled_seeds  # the same seeds: paired
    c = compare_pair("v1", score.outcomes, "v2", worse.outcomes, resamples=200)
    assert (c.pairs, c.a_only, c.b_only) == (6, 4, 0)
    assert worse.summary(ks=(1, 2)).pass_at == {1: 0.0, 2: 0.0}


def test_greedy_off_plays_sampled_episodes_only():
    engine = ScriptedEngine("v", "4")
    score = evaluate(engine, ("2 + 2",), 3, 0.7, 2, seed=0, greedy=False)
    assert (score.episodes, score.successes, score.greedy_episodes) == (3, 3, 0)
    assert {t for t, _ in engine.calls} == {0.7}

"""Held-out evaluation of one policy version, in-process: the base model with the version's adapter
(producers.policy.engine.local.LocalEngine, as the policy server loads it) plays each held-out calc task
the way the rollout driver does (tool calls to the env, the observation back as the tool's answer),
and the env's verifier decides success. Nothing is recorded: the evaluation never feeds training.

This is the in-process side of the one evaluation path: it produces the same per-episode
`infra.evaluation.outcomes.Outcome`s as `agentstream eval` (paired by task and sample index, the
sample's seed fixed by the evaluation's `seed`, so two versions scored with one seed are paired), and
the same summary and tests (`infra.evaluation`) read them: `demo --learn`, `bench learn` and the
training gate call `evaluate` here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infra.evaluation.outcomes import Outcome, PolicySummary, summarize
from infra.learn.tasks import TOOLS, prompt_messages
from producers.envs.calc import CalcEnv

GREEDY_SEED_OFFSET = 999  # the greedy episode's seed slot per task (samples use 0..samples-1)


@dataclass(frozen=True)
class HeldoutScore:
    """One version's held-out figures: sampled episodes (`samples` per task at the evaluation's
    temperature), greedy episodes (temperature 0, one per task; 0 when `greedy=False`), and every
    episode's `Outcome` for the paired statistics (`infra.evaluation.outcomes.compare_pair`)."""

    version: str
    episodes: int
    successes: int
    greedy_episodes: int = 0
    greedy_successes: int = 0
    outcomes: tuple[Outcome, ...] = ()

    @property
    def rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def greedy_rate(self) -> float:
        return self.greedy_successes / self.greedy_episodes if self.greedy_episodes else 0.0

    def summary(self, ks: tuple[int, ...] = (1,)) -> PolicySummary:
        """The shared summary (Wilson interval, pass@k, ...) of these outcomes."""
        return summarize(self.version, self.outcomes, ks)


def load_engine(base: Path, adapter: Path | None, version: str):
    from producers.policy.engine.local import LocalEngine

    return LocalEngine(base, adapter=adapter, version=version, device="cpu")


def evaluate(
    engine,
    expressions: tuple[str, ...],
    samples: int,
    temperature: float,
    max_turns: int,
    seed: int,
    *,
    greedy: bool = True,
) -> HeldoutScore:
    """`samples` episodes of every held-out expression at `temperature`, and with `greedy` one more
    at temperature 0. Sample j of expression i is played with seed `seed + 1000 * i + j` whatever the
    version, so two versions evaluated with one seed are paired episode by episode."""
    if samples < 0:
        raise ValueError(f"samples={samples}: must be >= 0")
    outcomes = []
    for i, expression in enumerate(expressions):
        for j in range(samples):
            outcomes.append(_episode(engine, expression, j, temperature, max_turns, seed + 1000 * i + j))
        if greedy:
            outcomes.append(
                _episode(engine, expression, 0, 0.0, max_turns, seed + 1000 * i + GREEDY_SEED_OFFSET, True)
            )
    summary = summarize(engine.version, outcomes)
    return HeldoutScore(
        engine.version, summary.episodes, summary.successes, summary.greedy_episodes,
        summary.greedy_successes, tuple(outcomes),
    )  # fmt: skip


def _episode(
    engine, expression: str, sample: int, temperature: float, max_turns: int, seed: int, greedy: bool = False
) -> Outcome:
    success = play(engine, expression, temperature, max_turns, seed)
    return Outcome(expression, sample, seed, success, 1.0 if success else 0.0, greedy)


def play(engine, expression: str, temperature: float, max_turns: int, seed: int) -> bool:
    """One episode; True when the verifier accepts the submitted answer."""
    from producers.policy.engine.sampling import SamplingParams
    from producers.policy.tool_calls import parse

    env = CalcEnv(max_turns=max_turns)
    ts = env.reset(task={"expression": expression})
    messages = prompt_messages(expression)
    turn = 0
    while not ts.done:
        params = SamplingParams(temperature=temperature, max_tokens=48, seed=seed + turn)
        sample = engine.generate(engine.render(messages, TOOLS), params)[0]
        parsed = parse(sample.text)
        if parsed.calls:
            call = parsed.calls[0]
            ts = env.step({"tool": call.name, "params": call.arguments})
            messages += [
                {"role": "assistant", "content": parsed.text, "tool_calls": [call.openai(f"call_{turn}")]},
                {"role": "tool", "tool_call_id": f"call_{turn}", "content": ts.observation},
            ]
        else:
            ts = env.step({"tool": "submit", "params": {"answer": parsed.text.strip()}})
        turn += 1
    return bool(env.verify())

"""Held-out evaluation of one policy version, in-process: the base model with the version's adapter
(producers.policy.engine.local.LocalEngine, as the policy server loads it) plays each held-out calc task
the way the rollout driver does (tool calls to the env, the observation back as the tool's answer),
and the env's verifier decides success. Nothing is recorded: the evaluation never feeds training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infra.learn.tasks import TOOLS, prompt_messages
from producers.envs.calc import CalcEnv


@dataclass(frozen=True)
class HeldoutScore:
    version: str
    episodes: int
    successes: int

    @property
    def rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


def load_engine(base: Path, adapter: Path | None, version: str):
    from producers.policy.engine.local import LocalEngine

    return LocalEngine(base, adapter=adapter, version=version, device="cpu")


def evaluate(
    engine, expressions: tuple[str, ...], samples: int, temperature: float, max_turns: int, seed: int
) -> HeldoutScore:
    """`samples` episodes of every held-out expression (the same seeds for every version)."""
    wins = 0
    for i, expression in enumerate(expressions):
        for j in range(samples):
            wins += play(engine, expression, temperature, max_turns, seed + 1000 * i + j)
    return HeldoutScore(engine.version, len(expressions) * samples, wins)


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

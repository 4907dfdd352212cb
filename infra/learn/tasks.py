"""The calc tasks of the learning demo, pure: disjoint train / held-out expressions and the scripted
demonstrations the warm start is trained on.

Expressions are drawn by `generate_expression` from seeds; the held-out set is fixed by its own seed
before anything is trained and shares no expression with the training set (checked). A
demonstration is what a careful agent does: call `calculator` with the expression as written, then
`submit` the value it returned, rendered exactly as the rollout driver talks to the policy.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from producers.envs.arithmetic import generate_expression, safe_eval
from producers.envs.calc import CalcEnv, format_number
from producers.rollout.driver import SYSTEM_PROMPT, tool_specs

TOOLS = tool_specs(["calculator", "submit"])


@dataclass(frozen=True)
class TaskSplit:
    train: tuple[str, ...]
    heldout: tuple[str, ...]


def split_expressions(difficulty: int, draws: int, heldout: int, seed: int) -> TaskSplit:
    """Distinct expressions from `draws` seeded draws, shuffled by `seed`; the first `heldout` are
    held out, the rest train.

    >>> s = split_expressions(2, 500, 20, seed=0)
    >>> len(s.heldout), len(set(s.train) & set(s.heldout))
    (20, 0)
    """
    pool = sorted({generate_expression(random.Random(i), difficulty) for i in range(draws)})
    random.Random(seed).shuffle(pool)
    if len(pool) <= heldout:
        raise ValueError(f"heldout: {heldout} leaves no training task out of {len(pool)} expressions")
    split = TaskSplit(tuple(pool[heldout:]), tuple(pool[:heldout]))
    assert not set(split.train) & set(split.heldout)
    return split


def prompt_messages(expression: str) -> list[dict]:
    """The messages the rollout driver opens an episode of `expression` with."""
    observation = CalcEnv().reset(task={"expression": expression}).observation
    return [
        {"role": "system", "content": SYSTEM_PROMPT.format(terminal="submit")},
        {"role": "user", "content": observation},
    ]


def _call(name: str, arguments: dict, call_id: str) -> dict:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def demonstration(expression: str) -> list[dict]:
    """The scripted episode: calculator(expression), then submit(the value it printed).

    >>> [m["role"] for m in demonstration("3 + 4")]
    ['system', 'user', 'assistant', 'tool', 'assistant']
    >>> demonstration("3 + 4")[3]["content"]
    '7'
    """
    value = format_number(safe_eval(expression))
    return [
        *prompt_messages(expression),
        _call("calculator", {"expression": expression}, "call_0"),
        {"role": "tool", "tool_call_id": "call_0", "content": value},
        _call("submit", {"answer": value}, "call_1"),
    ]


def guess(expression: str, seed: int) -> list[dict]:
    """The careless episode: `submit` a number drawn from -9..18 (the range of difficulty-1 values)
    without calling the calculator; right only by chance. Deterministic per expression and seed.

    >>> [m["role"] for m in guess("3 + 4", seed=0)]
    ['system', 'user', 'assistant']
    """
    drawn = random.Random(f"{seed}:{expression}").randint(-9, 18)
    return [*prompt_messages(expression), _call("submit", {"answer": str(drawn)}, "call_0")]


def warm_start_episodes(train: tuple[str, ...], guesses: int, seed: int) -> list[list[dict]]:
    """The warm start's episodes: each training expression's demonstration, and `guesses` careless
    episodes of it (seeds `seed`, `seed + 1`, ...).

    >>> len(warm_start_episodes(("1 + 2", "3 - 1"), guesses=1, seed=0))
    4
    """
    return [demonstration(e) for e in train] + [guess(e, seed + g) for g in range(guesses) for e in train]


def write_tasks(expressions: tuple[str, ...], path: Path, prefix: str) -> Path:
    """A task file for `agentstream rollout` (one calc task per expression)."""
    lines = [
        json.dumps(
            {"task_id": f"{prefix}-{i:04d}", "env": "calc", "domain": "math", "task": {"expression": e}}
        )
        for i, e in enumerate(expressions)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path

"""`CalcEnv`: a multi-turn arithmetic task with a calculator tool, registered as "calc".

The agent is asked for the value of an expression; it may call `calculator` (params
`{"expression": str}`, evaluated by the safe walker of `producers.envs.arithmetic`) any number of
times and ends the episode with `submit` (params `{"answer": number or numeric string}`). Reward is
1.0 for a correct submission, 0.0 otherwise; `verify()` compares what was submitted with the true
value the env computed itself. Difficulty 1 (two numbers below 10) is learnable without the tool;
higher levels add operands, digits and operators, so the tool is needed.

    env = CalcEnv(difficulty=2)
    env.reset(seed=3)                       # same seed, same expression
    env.reset(task={"expression": "6*7"})   # or an explicit task
"""

from __future__ import annotations

import random
import time
from typing import Any

from producers.envs.arithmetic import Number, generate_expression, parse_number, safe_eval, same_number
from producers.envs.errors import EnvError, ExpressionError
from producers.envs.protocol import Action, AgentEnv, TimeStep, checked_action, finish_step

MAX_DIFFICULTY = 5
PROMPT = (
    "Tools: calculator(expression) evaluates an arithmetic expression; submit(answer) gives your "
    'final answer and ends the task. Compute the value of "{expression}"'
)
"""The task: the expression comes last and quoted, exactly as a tool call would quote it."""


def format_number(value: Number) -> str:
    """How the calculator prints a value: integers as integers, floats without noise.

    >>> format_number(12), format_number(2.5), format_number(1 / 3), format_number(4.0)
    ('12', '2.5', '0.333333333333', '4')
    """
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.12g}" if isinstance(value, float) else str(value)


class CalcEnv(AgentEnv):
    """Arithmetic with a calculator tool (see the module docstring)."""

    domain = "math"
    terminal_tools = frozenset({"submit"})

    def __init__(self, difficulty: int = 1, max_turns: int = 8):
        if not isinstance(difficulty, int) or not 1 <= difficulty <= MAX_DIFFICULTY:
            raise EnvError(f"difficulty: expected an integer from 1 to {MAX_DIFFICULTY}, got {difficulty!r}")
        if not isinstance(max_turns, int) or max_turns < 1:
            raise EnvError(f"max_turns: expected a positive integer, got {max_turns!r}")
        self.difficulty = difficulty
        self.max_turns = max_turns
        self.expression: str | None = None
        self.answer: Number | None = None
        self.submitted: Number | None = None
        self.turn = 0
        self._done = False

    @property
    def available_tools(self) -> list[str]:
        return ["calculator", "submit"]

    def reset(self, *, task: Any = None, seed: int | None = None) -> TimeStep:
        """A new task: `task` (`{"expression": ...}` or the expression itself) or one drawn from
        `seed` (a random seed when None; `info["seed"]` says which)."""
        if task is None:
            seed = random.randrange(2**31) if seed is None else seed
            expression = generate_expression(random.Random(seed), self.difficulty)
        else:
            expression = _task_expression(task)
        try:
            self.answer = safe_eval(expression)
        except ExpressionError as exc:
            raise EnvError(f"task expression {expression!r}: {exc}") from None
        self.expression, self.submitted, self.turn, self._done = expression, None, 0, False
        info = {"expression": expression, "difficulty": self.difficulty, "seed": seed}
        info |= {"max_turns": self.max_turns, "available_tools": self.available_tools}
        return TimeStep(observation=PROMPT.format(expression=expression), info=info)

    def step(self, action: Action) -> TimeStep:
        """Run `calculator` or `submit`; an unknown tool or bad params answer an error (exit_code 1)."""
        tool, params = checked_action(action, self.expression is not None, self._done)
        self.turn += 1
        if not isinstance(params, dict):
            ts = _failed(f"params: expected an object, got {params!r}")
        elif tool == "calculator":
            ts = self._calculator(params)
        elif tool == "submit":
            ts = self._submit(params)
        else:
            ts = _failed(f"unknown tool {tool!r}; available tools: {self.available_tools}")
        finish_step(ts, self.turn, self.max_turns)
        self._done = ts.done
        ts.info["tool"] = tool
        return ts

    def _calculator(self, params: dict[str, Any]) -> TimeStep:
        if self.step_deadline is not None and time.monotonic() >= self.step_deadline:
            return _failed("calculator: the step deadline passed")
        try:
            value = safe_eval(params.get("expression"), deadline=self.step_deadline)
        except ExpressionError as exc:
            return _failed(f"calculator: {exc}")
        return TimeStep(observation=format_number(value), info={"exit_code": 0, "error": None})

    def _submit(self, params: dict[str, Any]) -> TimeStep:
        try:
            self.submitted = parse_number(params.get("answer"))
        except ExpressionError as exc:
            ts = _failed(f"submit: {exc}")
            ts.terminated = True
            return ts
        correct = self.verify()
        text = "correct" if correct else "incorrect"
        return TimeStep(
            observation=f"submitted {format_number(self.submitted)}: {text}",
            reward=1.0 if correct else 0.0,
            terminated=True,
            info={"exit_code": 0, "error": None},
        )

    def verify(self) -> bool | None:
        """True iff the submitted number equals the true value; None before the first reset()."""
        if self.answer is None:
            return None
        return self.submitted is not None and same_number(self.submitted, self.answer)


def _task_expression(task: Any) -> str:
    expression = task.get("expression") if isinstance(task, dict) else task
    if not isinstance(expression, str) or not expression.strip():
        raise EnvError(f"task: expected {{'expression': str}} or an expression string, got {task!r}")
    return expression


def _failed(error: str) -> TimeStep:
    return TimeStep(observation=f"error: {error}", info={"exit_code": 1, "error": error})

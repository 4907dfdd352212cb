"""The environment protocol: `TimeStep`, `AgentEnv` and the pass-through `EnvWrapper`.

An action is a dict `{"tool": str, "params": dict, "thought": str (optional)}`; every `reset()` and
`step()` returns a `TimeStep`. Success is decided by `verify()` from the env's own state (what was
submitted, what the task's answer is), never from what the agent claims.

    with make("calc", difficulty=2) as env:
        ts = env.reset(seed=7)
        ts = env.step({"tool": "calculator", "params": {"expression": "12*34"}})
        ts = env.step({"tool": "submit", "params": {"answer": ts.observation}})
        env.verify()

No I/O and no broker here; recording is `producers.envs.wrappers.RecorderWrapper`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from producers.envs.errors import EnvError

Action = dict[str, Any]

# Task fields an env keeps from the agent and from every record: the gold answer of a task (for a
# coding task, the reference fix), used only to check the task itself.
HIDDEN_TASK_FIELDS = frozenset({"reference_patch"})


def shown_task(task: dict[str, Any]) -> dict[str, Any]:
    """`task` without its hidden fields (what may be recorded or shown).

    >>> shown_task({"task_id": "t", "reference_patch": "diff ..."})
    {'task_id': 't'}
    """
    return {k: v for k, v in task.items() if k not in HIDDEN_TASK_FIELDS}


@dataclass
class TimeStep:
    """What the env answers to `reset()` and `step()`.

    >>> TimeStep("ok", truncated=True).done
    True
    """

    observation: str = ""
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """The episode is over: the task ended (`terminated`) or was cut short (`truncated`)."""
        return self.terminated or self.truncated


class AgentEnv(ABC):
    """A tool-using environment. Subclasses set `domain` and `terminal_tools` and implement
    `reset`, `step` and `available_tools`; `verify` says whether the episode succeeded.

    `step_deadline` (a `time.monotonic()` value or None) is set by `TimeoutWrapper`: tools that can
    run long check it and stop with an error when it has passed."""

    domain: str = "generic"
    terminal_tools: frozenset[str] = frozenset({"submit"})
    step_deadline: float | None = None

    @abstractmethod
    def reset(self, *, task: Any = None, seed: int | None = None) -> TimeStep:
        """Start a new episode on `task` (env-specific; None: one drawn from `seed`)."""

    @abstractmethod
    def step(self, action: Action) -> TimeStep:
        """Run one tool call `{"tool", "params"[, "thought"]}`."""

    @property
    @abstractmethod
    def available_tools(self) -> list[str]:
        """The tool names `step()` accepts."""

    def verify(self) -> bool | None:
        """Whether the episode succeeded, from the env's state; None when the env cannot tell."""
        return None

    def close(self) -> None:
        """Release what the env holds (processes, containers); the default holds nothing."""
        return None

    @property
    def unwrapped(self) -> AgentEnv:
        """The innermost env (itself, unless wrapped)."""
        return self

    def __enter__(self) -> AgentEnv:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def checked_action(action: Any, started: bool, done: bool) -> tuple[Any, Any]:
    """The (tool, params) of an action an env was asked to step with; `EnvError` when the env has
    not been reset, its episode already ended, or the action is not a dict. `params` may still be
    a non-dict: each env answers that as a tool error (an agent mistake, not a caller bug)."""
    if not started:
        raise EnvError("step() before reset(): call reset() first")
    if done:
        raise EnvError("step() after the episode ended: call reset() for a new one")
    if not isinstance(action, dict):
        raise EnvError(f"action: expected a dict with 'tool' and 'params', got {action!r}")
    return action.get("tool"), action.get("params") or {}


def finish_step(ts: TimeStep, count: int, limit: int, key: str = "turn") -> TimeStep:
    """`ts` as the episode's `count`-th step of at most `limit`: cut short (`truncated`) at the
    limit unless the step ended the episode, with the count in `info[key]`.

    >>> finish_step(TimeStep("ok"), 3, 3).truncated, finish_step(TimeStep(terminated=True), 3, 3).truncated
    (True, False)
    """
    if not ts.terminated and count >= limit:
        ts.truncated = True
    ts.info[key] = count
    return ts


class EnvWrapper(AgentEnv):
    """Passes everything to the wrapped env; wrappers override only what they change."""

    def __init__(self, env: AgentEnv):
        self.env = env

    @property
    def domain(self) -> str:  # type: ignore[override]
        return self.env.domain

    @property
    def terminal_tools(self) -> frozenset[str]:  # type: ignore[override]
        return self.env.terminal_tools

    @property
    def available_tools(self) -> list[str]:
        return self.env.available_tools

    @property
    def unwrapped(self) -> AgentEnv:
        return self.env.unwrapped

    def reset(self, *, task: Any = None, seed: int | None = None) -> TimeStep:
        return self.env.reset(task=task, seed=seed)

    def step(self, action: Action) -> TimeStep:
        return self.env.step(action)

    def verify(self) -> bool | None:
        return self.env.verify()

    def close(self) -> None:
        self.env.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env!r})"

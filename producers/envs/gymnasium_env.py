"""`GymnasiumEnv`: any Gymnasium-style environment as an `AgentEnv`, so the one env recorder
(`RecorderWrapper`) and the other wrappers work on it like on the built-in envs.

Works with anything that has `reset(...)` returning `obs` or `(obs, info)`, `step(action)` returning
`(obs, reward, terminated, truncated, info)` and optionally `close()`; gymnasium itself is not
needed. An action is `{"tool": "env.step", "params": {"action": <JSON value>}}` (`env_action(x)`
builds one); the JSON value is what is recorded, and `decode_action` turns it back into what the
inner env takes (e.g. `numpy.asarray`). Observations become text (JSON for non-strings). Success
is `info["is_success"]` (Gymnasium's convention) or `info["success"]` when present, else
`terminated and reward > 0`; override with `success_fn`.

    env = RecorderWrapper(GymnasiumEnv(MyEnv(), domain="control"), recorder, task_id="cartpole")
    ts = env.reset(seed=0)
    ts = env.step(env_action(1))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from producers.envs.errors import EnvError
from producers.envs.protocol import Action, AgentEnv, TimeStep
from producers.sdk.episode import as_text

SuccessFn = Callable[[Any, float, bool, bool, dict], bool]
STEP_TOOL = "env.step"


def jsonable(value: Any) -> Any:
    """Actions and infos as JSON values: numpy scalars/arrays become numbers/lists, other objects text.

    >>> jsonable(3), jsonable([1, 2.5]), jsonable({"a": (1, 2)})
    (3, [1, 2.5], {'a': [1, 2]})
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return value.tolist()
    return str(value)


def env_action(value: Any, tool: str = STEP_TOOL) -> Action:
    """The `AgentEnv` action that steps a `GymnasiumEnv` with `value`.

    >>> env_action(1)
    {'tool': 'env.step', 'params': {'action': 1}}
    """
    return {"tool": tool, "params": {"action": jsonable(value)}}


def default_success(obs: Any, reward: float, terminated: bool, truncated: bool, info: dict) -> bool:
    """Gymnasium's `is_success` when the env reports it, else "terminated with a positive reward"."""
    for key in ("is_success", "success"):
        if key in info:
            return bool(info[key])
    return bool(terminated and reward > 0)


class GymnasiumEnv(AgentEnv):
    """A Gymnasium-style env behind the `AgentEnv` protocol (see the module docstring)."""

    terminal_tools: frozenset[str] = frozenset()

    def __init__(
        self,
        env: Any,
        *,
        domain: str = "generic",
        success_fn: SuccessFn = default_success,
        decode_action: Callable[[Any], Any] | None = None,
    ):
        self.env = env
        self.domain = domain
        self.success_fn = success_fn
        self.decode_action = decode_action
        self._last: tuple[Any, float, bool, bool, dict] | None = None

    @property
    def available_tools(self) -> list[str]:
        return [STEP_TOOL]

    def reset(self, *, task: Any = None, seed: int | None = None) -> TimeStep:
        """`task`, when given, is passed as Gymnasium's `options`."""
        kwargs: dict[str, Any] = {} if seed is None else {"seed": seed}
        if task is not None:
            kwargs["options"] = task
        result = self.env.reset(**kwargs)
        obs, info = result if _is_obs_info(result) else (result, {})
        self._last = None
        return TimeStep(observation=as_text(jsonable(obs)), info=_recordable(info))

    def step(self, action: Action) -> TimeStep:
        if not isinstance(action, dict) or not isinstance(action.get("params"), dict):
            raise EnvError(f"action: expected {{'tool', 'params': {{'action': ...}}}}, got {action!r}")
        value = action["params"].get("action")
        obs, reward, terminated, truncated, info = self.env.step(
            self.decode_action(value) if self.decode_action else value
        )
        info = info if isinstance(info, dict) else {}
        self._last = (obs, float(reward), bool(terminated), bool(truncated), info)
        return TimeStep(
            observation=as_text(jsonable(obs)),
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
            info=_recordable(info),
        )

    def verify(self) -> bool | None:
        """`success_fn` over the last step; False before any step (nothing was achieved)."""
        return False if self._last is None else bool(self.success_fn(*self._last))

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            close()


def _is_obs_info(result: Any) -> bool:
    return isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)


def _recordable(info: dict) -> dict[str, Any]:
    """The info as JSON values; `error` kept only as text and `exit_code` only as an integer,
    since the recorder puts them in typed fields of `step.recorded`."""
    out = jsonable(info)
    if not isinstance(out.get("error"), str):
        out.pop("error", None)
    if not isinstance(out.get("exit_code"), int) or isinstance(out.get("exit_code"), bool):
        out.pop("exit_code", None)
    return out

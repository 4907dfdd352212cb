"""`RecordedEnv`: record any Gymnasium-style environment episode by episode.

Works with anything that has `reset(...)` returning `obs` or `(obs, info)`, `step(action)` returning
`(obs, reward, terminated, truncated, info)` and optionally `close()`; gymnasium itself is not
needed. Each `reset()` starts an episode (`episode.started`, the initial observation in its
metadata); each `step(action)` records a `step.recorded` (tool `env.step` or `describe_action`'s
name, `params={"action": ...}`, the observation as text, the reward, the latency); the step that
returns `terminated` or `truncated` ends it. Success: `info["is_success"]` (Gymnasium's convention)
or `info["success"]` when present, else `terminated and reward > 0`; override with `success_fn`.
A `reset()` or `close()` while an episode is open ends it as truncated.

    env = RecordedEnv(MyEnv(), recorder, task_id="cartpole", domain="control")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from producers.episode import as_text
from producers.recorder import AgentRecorder, Episode

log = logging.getLogger(__name__)

SuccessFn = Callable[[Any, float, bool, bool, dict], bool]


def jsonable(value: Any) -> Any:
    """Actions as JSON values: numpy scalars/arrays become numbers/lists, other objects text.

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


def default_success(obs: Any, reward: float, terminated: bool, truncated: bool, info: dict) -> bool:
    """Gymnasium's `is_success` when the env reports it, else "terminated with a positive reward"."""
    for key in ("is_success", "success"):
        if key in info:
            return bool(info[key])
    return bool(terminated and reward > 0)


class RecordedEnv:
    """A wrapper that records every episode of `env` with `recorder` (see the module docstring)."""

    def __init__(
        self,
        env: Any,
        recorder: AgentRecorder,
        *,
        task_id: str,
        task: str = "",
        domain: str = "generic",
        group_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        describe_action: Callable[[Any], str] | None = None,
        success_fn: SuccessFn = default_success,
    ):
        self.env = env
        self.recorder = recorder
        self.episode_options = {"task_id": task_id, "task": task, "domain": domain, "group_id": group_id}
        self.metadata = dict(metadata or {})
        self.describe_action = describe_action
        self.success_fn = success_fn
        self.episode: Episode | None = None
        self.episodes = 0

    def reset(self, *args: Any, **kwargs: Any):
        self._end_open("reset() during an episode")
        result = self.env.reset(*args, **kwargs)
        obs, info = result if _is_obs_info(result) else (result, {})
        metadata = {**self.metadata, "initial_observation": as_text(jsonable(obs)), "episode": self.episodes}
        if info:
            metadata["reset_info"] = jsonable(info)
        self.episode = self.recorder.episode(**self.episode_options, metadata=metadata)
        self.episodes += 1
        return result

    def step(self, action: Any):
        if self.episode is None:
            raise RuntimeError("call reset() before step(): no episode is open")
        started = time.perf_counter()
        obs, reward, terminated, truncated, info = self.env.step(action)
        latency_ms = (time.perf_counter() - started) * 1000
        tool = self.describe_action(action) if self.describe_action else "env.step"
        error = info.get("error") if isinstance(info, dict) and isinstance(info.get("error"), str) else None
        self.episode.step(
            tool=tool,
            params={"action": jsonable(action)},
            observation=jsonable(obs),
            reward=float(reward),
            latency_ms=latency_ms,
            error=error,
        )
        if terminated or truncated:
            success = self.success_fn(obs, float(reward), bool(terminated), bool(truncated), info or {})
            self.episode.end(success=success, terminated=bool(terminated), truncated=bool(truncated))
            self.episode = None
        return obs, reward, terminated, truncated, info

    def _end_open(self, why: str) -> None:
        if self.episode is not None:
            log.info("trajectory %s: %s; recorded as truncated", self.episode.trajectory_id, why)
            self.episode.end(success=False, terminated=False, truncated=True)
            self.episode = None

    def close(self) -> None:
        self._end_open("close() during an episode")
        close = getattr(self.env, "close", None)
        if close is not None:
            close()

    def __getattr__(self, name: str) -> Any:
        # Everything else (action_space, render, ...) is the wrapped env's.
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)


def _is_obs_info(result: Any) -> bool:
    return isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)

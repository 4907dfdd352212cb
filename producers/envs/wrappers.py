"""The six env wrappers: step limit, wall-clock timeout, reward function, recording, episode
statistics, observation truncation. Each changes one thing and passes the rest through.

Order matters: put `RecorderWrapper` outside the wrappers whose effect should be recorded
(`MaxStepsWrapper`, `TimeoutWrapper`, `RewardFnWrapper`, `ObservationTruncateWrapper`):

    env = RecorderWrapper(TimeoutWrapper(MaxStepsWrapper(make("calc"), 8), 60), recorder)

Wrappers build new `TimeStep`s (`dataclasses.replace`) rather than editing the inner env's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from producers.envs.errors import EnvError
from producers.envs.protocol import Action, AgentEnv, EnvWrapper, TimeStep, shown_task
from producers.sdk.recorder import AgentRecorder, Episode

log = logging.getLogger(__name__)

RewardFn = Callable[[list[dict[str, Any]], Action, TimeStep], float]


class MaxStepsWrapper(EnvWrapper):
    """Truncates the episode at `max_steps` steps unless it terminated on that step."""

    def __init__(self, env: AgentEnv, max_steps: int = 30):
        super().__init__(env)
        if not isinstance(max_steps, int) or max_steps < 1:
            raise EnvError(f"max_steps: expected a positive integer, got {max_steps!r}")
        self.max_steps = max_steps
        self.step_count = 0

    def reset(self, *, task: Any = None, seed: int | None = None) -> TimeStep:
        self.step_count = 0
        return self.env.reset(task=task, seed=seed)

    def step(self, action: Action) -> TimeStep:
        ts = self.env.step(action)
        self.step_count += 1
        if self.step_count >= self.max_steps and not ts.terminated:
            ts = replace(ts, truncated=True, info={**ts.info, "max_steps": self.max_steps})
        return ts


class TimeoutWrapper(EnvWrapper):
    """Truncates the episode once `timeout_s` seconds have passed since `reset()`.

    A running step is interrupted: the deadline is set as `step_deadline` on the innermost env
    (its tools stop when it passes), and with `threaded=True` (the default) the step runs in a
    worker thread that is abandoned when the deadline comes first; the episode is then over and
    the env must be reset (the abandoned thread may still finish in the background). The answer
    is `truncated=True`, `info["timeout"]=True`, `info["elapsed_seconds"]`.
    """

    def __init__(self, env: AgentEnv, timeout_s: float = 300.0, *, threaded: bool = True):
        super().__init__(env)
        if not timeout_s > 0:
            raise EnvError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self.threaded = threaded
        self._started: float | None = None

    @property
    def elapsed_seconds(self) -> float:
        return 0.0 if self._started is None else time.monotonic() - self._started

    def reset(self, *, task: Any = None, seed: int | None = None) -> TimeStep:
        ts = self.env.reset(task=task, seed=seed)
        self._started = time.monotonic()
        self.env.unwrapped.step_deadline = self._started + self.timeout_s
        return ts

    def step(self, action: Action) -> TimeStep:
        if self._started is None:
            raise EnvError("step() before reset(): the timeout counts from reset()")
        remaining = self.timeout_s - self.elapsed_seconds
        if remaining <= 0:
            return self._timed_out(TimeStep(observation="error: the episode timed out"))
        ts = self._run(action, remaining) if self.threaded else self.env.step(action)
        if ts is None:
            return self._timed_out(
                TimeStep(observation=f"error: the step did not finish in {remaining:.3g}s")
            )
        if self.elapsed_seconds >= self.timeout_s and not ts.terminated:
            return self._timed_out(ts)
        return ts

    def _run(self, action: Action, remaining: float) -> TimeStep | None:
        """The inner step in a worker thread; None if it did not finish within `remaining`."""
        outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                outcome["ts"] = self.env.step(action)
            except BaseException as exc:
                outcome["error"] = exc

        worker = threading.Thread(target=target, name="env-step", daemon=True)
        worker.start()
        worker.join(remaining)
        if worker.is_alive():
            log.warning("env step still running after the %.3gs timeout; abandoned", self.timeout_s)
            return None
        if "error" in outcome:
            raise outcome["error"]
        return outcome["ts"]

    def _timed_out(self, ts: TimeStep) -> TimeStep:
        info = {**ts.info, "timeout": True, "elapsed_seconds": round(self.elapsed_seconds, 3)}
        return replace(ts, truncated=True, info=info)


class RewardFnWrapper(EnvWrapper):
    """Sets each step's reward to `reward_fn(history, action, timestep)`; `history` holds the
    earlier steps of the episode as `{"tool", "params", "observation", "reward"}`."""

    def __init__(self, env: AgentEnv, reward_fn: RewardFn):
        super().__init__(env)
        self.reward_fn = reward_fn
        self.history: list[dict[str, Any]] = []

    def reset(self, *, task: Any = None, seed: int | None = None) -> TimeStep:
        self.history = []
        return self.env.reset(task=task, seed=seed)

    def step(self, action: Action) -> TimeStep:
        ts = self.env.step(action)
        ts = replace(ts, reward=float(self.reward_fn(list(self.history), action, ts)))
        self.history.append(
            {
                "tool": action.get("tool"),
                "params": action.get("params") or {},
                "observation": ts.observation,
                "reward": ts.reward,
            }
        )
        return ts


class EpisodeStatisticsWrapper(EnvWrapper):
    """On the last step, `info["episode"] = {"r": total reward, "l": steps, "t": seconds}`."""

    def __init__(self, env: AgentEnv):
        super().__init__(env)
        self._reward, self._length, self._started = 0.0, 0, time.monotonic()

    def reset(self, *, task: Any = None, seed: int | None = None) -> TimeStep:
        ts = self.env.reset(task=task, seed=seed)
        self._reward, self._length, self._started = 0.0, 0, time.monotonic()
        return ts

    def step(self, action: Action) -> TimeStep:
        ts = self.env.step(action)
        self._reward += ts.reward
        self._length += 1
        if ts.done:
            stats = {
                "r": round(self._reward, 4),
                "l": self._length,
                "t": round(time.monotonic() - self._started, 2),
            }
            ts = replace(ts, info={**ts.info, "episode": stats})
        return ts


class ObservationTruncateWrapper(EnvWrapper):
    """Cuts observations longer than `max_chars` (on reset and step) and appends `suffix`;
    `info["observation_truncated"] = True` and `info["observation_chars"]` (the original length)."""

    def __init__(self, env: AgentEnv, max_chars: int = 8000, suffix: str = "...[truncated]"):
        super().__init__(env)
        if not isinstance(max_chars, int) or max_chars < 1:
            raise EnvError(f"max_chars: expected a positive integer, got {max_chars!r}")
        self.max_chars, self.suffix = max_chars, suffix

    def reset(self, *, task: Any = None, seed: int | None = None) -> TimeStep:
        return self._cut(self.env.reset(task=task, seed=seed))

    def step(self, action: Action) -> TimeStep:
        return self._cut(self.env.step(action))

    def _cut(self, ts: TimeStep) -> TimeStep:
        if len(ts.observation) <= self.max_chars:
            return ts
        info = {**ts.info, "observation_truncated": True, "observation_chars": len(ts.observation)}
        return replace(ts, observation=ts.observation[: self.max_chars] + self.suffix, info=info)


class RecorderWrapper(EnvWrapper):
    """The env recorder (the only one; Gymnasium-style envs come through `GymnasiumEnv`).

    Records every episode with an `AgentRecorder`: `reset()` starts one (`episode.started`, the
    task text is the first observation), each step is a `step.recorded` (tool, params, thought,
    observation, reward, exit_code and error from `info`, latency), and the step that ends the
    episode records `episode.ended` with `success` from `env.verify()` (the env's state, never the
    agent's claim; `outcome_source` says so) and the step's terminated/truncated. A `reset()` or
    `close()` while an episode is open ends it as truncated and failed.

    `task_id`: fixed, or taken from a dict task's `"task_id"`, else `"<domain>"` / `"<domain>:<seed>"`.
    """

    def __init__(
        self,
        env: AgentEnv,
        recorder: AgentRecorder,
        *,
        task_id: str | None = None,
        group_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        policy_version: str | None = None,
    ):
        super().__init__(env)
        self.recorder = recorder
        self.policy_version = policy_version  # None: the recorder's
        self.task_id = task_id
        self.group_id = group_id
        self.metadata = dict(metadata or {})
        self.episode: Episode | None = None

    def reset(self, *, task: Any = None, seed: int | None = None) -> TimeStep:
        self._abandon("reset() while the episode was open")
        ts = self.env.reset(task=task, seed=seed)
        seed = seed if seed is not None else ts.info.get("seed")  # the env may draw its own
        metadata = {**self.metadata, "seed": seed}
        if isinstance(task, dict):
            metadata["task"] = shown_task(task)  # never the task's gold answer
        self.episode = self.recorder.episode(
            task_id=self._task_id(task, seed),
            task=ts.observation,
            domain=self.domain,
            group_id=self.group_id,
            metadata=metadata,
            policy_version=self.policy_version,
        )
        return ts

    def step(self, action: Action, step_fields: dict[str, Any] | None = None) -> TimeStep:
        """One env step, recorded. `step_fields`: what the policy reported for the completion that
        chose `action` (token ids, logprobs, prompt delta, continuity, policy_version...; the policy
        server's client-records `agentstream` object), recorded in the same `step.recorded`; None
        values are left out, `step_index` is the episode's own and latency adds to the env's."""
        if self.episode is None:
            raise EnvError("step() before reset(): there is no episode to record")
        started = time.perf_counter()
        ts = self.env.step(action)
        extra = {k: v for k, v in (step_fields or {}).items() if v is not None and k != "step_index"}
        latency_ms = (time.perf_counter() - started) * 1000 + (extra.pop("latency_ms", None) or 0.0)
        self.episode.step(
            thought=action.get("thought") or "",
            tool=str(action.get("tool") or ""),
            params=action.get("params") if isinstance(action.get("params"), dict) else None,
            observation=ts.observation,
            exit_code=ts.info.get("exit_code"),
            error=ts.info.get("error"),
            reward=ts.reward,
            latency_ms=latency_ms,
            **extra,
        )
        if ts.done:
            self._end(terminated=ts.terminated, truncated=ts.truncated)
        return ts

    def close(self) -> None:
        self._abandon("close() while the episode was open")
        self.env.close()

    def _end(self, *, terminated: bool, truncated: bool) -> None:
        verdict = self.env.verify()
        episode, self.episode = self.episode, None
        assert episode is not None
        episode.end(
            success=bool(verdict),
            score=None if verdict is None else float(verdict),
            terminated=terminated,
            truncated=truncated,
            outcome_source="unknown" if verdict is None else "env.verify",
        )

    def _abandon(self, why: str) -> None:
        if self.episode is not None:
            log.info("trajectory %s: %s; recorded as truncated", self.episode.trajectory_id, why)
            self._end(terminated=False, truncated=True)

    def _task_id(self, task: Any, seed: int | None) -> str:
        if self.task_id:
            return self.task_id
        if isinstance(task, dict) and isinstance(task.get("task_id"), str) and task["task_id"]:
            return task["task_id"]
        return self.domain if seed is None else f"{self.domain}:{seed}"

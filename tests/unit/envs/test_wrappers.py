"""Each wrapper's semantics against a small scripted env (no broker: RecorderWrapper is in
tests/integration/envs)."""

from __future__ import annotations

import threading
import time

import pytest

from producers.envs import (
    AgentEnv,
    CalcEnv,
    EnvError,
    EpisodeStatisticsWrapper,
    MaxStepsWrapper,
    ObservationTruncateWrapper,
    RewardFnWrapper,
    TimeoutWrapper,
    TimeStep,
)


class ScriptedEnv(AgentEnv):
    """Answers each step from a script of TimeSteps; `sleep` params make a step take that long."""

    domain = "scripted"

    def __init__(self, script: list[TimeStep] | None = None, first_observation: str = "start"):
        self.script = script or []
        self.first_observation = first_observation
        self.calls = 0
        self.released = threading.Event()

    @property
    def available_tools(self) -> list[str]:
        return ["work", "sleep", "finish"]

    def reset(self, *, task=None, seed=None) -> TimeStep:
        self.calls = 0
        return TimeStep(self.first_observation)

    def step(self, action) -> TimeStep:
        self.calls += 1
        if action["tool"] == "sleep":
            self.released.wait(action["params"]["seconds"])
        if action["tool"] == "finish":
            return TimeStep("done", reward=1.0, terminated=True, info={"exit_code": 0})
        if self.script:
            return self.script.pop(0)
        return TimeStep(f"step {self.calls}", info={"exit_code": 0})


WORK = {"tool": "work", "params": {}}
FINISH = {"tool": "finish", "params": {}}


def test_max_steps_truncates_at_the_count_and_reset_zeroes_it():
    env = MaxStepsWrapper(ScriptedEnv(), max_steps=3)
    env.reset()
    results = [env.step(WORK) for _ in range(3)]
    assert [r.truncated for r in results] == [False, False, True]
    assert results[-1].info["max_steps"] == 3 and env.step_count == 3
    env.reset()
    assert env.step_count == 0 and not env.step(WORK).truncated


def test_max_steps_leaves_a_terminating_last_step_terminated_only():
    env = MaxStepsWrapper(ScriptedEnv(), max_steps=2)
    env.reset()
    env.step(WORK)
    last = env.step(FINISH)
    assert last.terminated and not last.truncated


def test_max_steps_refuses_a_non_positive_limit():
    with pytest.raises(EnvError, match="max_steps: expected a positive integer, got 0"):
        MaxStepsWrapper(ScriptedEnv(), max_steps=0)


def test_timeout_truncates_after_the_deadline_with_info():
    env = TimeoutWrapper(ScriptedEnv(), timeout_s=0.2)
    env.reset()
    assert not env.step(WORK).truncated
    time.sleep(0.25)
    ts = env.step(WORK)
    assert ts.truncated and ts.info["timeout"] is True and ts.info["elapsed_seconds"] >= 0.2
    env.reset()
    assert not env.step(WORK).truncated  # the clock restarts at reset


def test_timeout_interrupts_a_running_step():
    inner = ScriptedEnv()
    env = TimeoutWrapper(inner, timeout_s=0.3)
    env.reset()
    started = time.monotonic()
    ts = env.step({"tool": "sleep", "params": {"seconds": 30}})
    took = time.monotonic() - started
    inner.released.set()  # let the abandoned worker thread finish
    assert ts.truncated and ts.info["timeout"] is True and "did not finish" in ts.observation
    assert took < 2


def test_timeout_sets_the_deadline_the_env_tools_respect():
    env = TimeoutWrapper(CalcEnv(), timeout_s=5)
    env.reset(task={"expression": "1 + 1"})
    deadline = env.unwrapped.step_deadline
    assert deadline is not None and 4 < deadline - time.monotonic() <= 5
    env.unwrapped.step_deadline = time.monotonic() - 1  # as if the deadline had passed mid-step
    ts = env.env.step({"tool": "calculator", "params": {"expression": "2 * 3"}})
    assert ts.info["exit_code"] == 1 and "deadline" in ts.observation


def test_timeout_leaves_a_terminating_step_terminated():
    inner = ScriptedEnv()
    env = TimeoutWrapper(inner, timeout_s=0.1, threaded=False)
    env.reset()
    inner.step = lambda action: (time.sleep(0.15), TimeStep("x", terminated=True))[1]  # type: ignore
    ts = env.step(FINISH)
    assert ts.terminated and not ts.truncated and "timeout" not in ts.info


def test_timeout_worker_errors_reach_the_caller():
    env = TimeoutWrapper(ScriptedEnv(), timeout_s=5)
    env.reset()
    with pytest.raises(KeyError, match="seconds"):
        env.step({"tool": "sleep", "params": {}})


def test_timeout_before_reset_is_an_error():
    with pytest.raises(EnvError, match="before reset"):
        TimeoutWrapper(ScriptedEnv(), timeout_s=1).step(WORK)


def test_reward_fn_sees_earlier_steps_the_action_and_the_timestep():
    seen = []

    def reward_fn(history, action, ts):
        seen.append((len(history), action["tool"], ts.observation))
        return 0.5 if action["tool"] == "finish" else -0.1

    env = RewardFnWrapper(ScriptedEnv(), reward_fn)
    env.reset()
    assert env.step(WORK).reward == -0.1
    assert env.step(FINISH).reward == 0.5
    assert seen == [(0, "work", "step 1"), (1, "finish", "done")]
    assert [h["tool"] for h in env.history] == ["work", "finish"] and env.history[0]["reward"] == -0.1
    env.reset()
    assert env.history == []


def test_episode_statistics_on_the_last_step_only():
    env = EpisodeStatisticsWrapper(ScriptedEnv([TimeStep("a", reward=0.25), TimeStep("b", reward=0.5)]))
    env.reset()
    first, second, last = env.step(WORK), env.step(WORK), env.step(FINISH)
    assert "episode" not in first.info and "episode" not in second.info
    assert last.info["episode"]["r"] == 1.75 and last.info["episode"]["l"] == 3
    assert 0 <= last.info["episode"]["t"] < 5
    env.reset()
    assert env.step(FINISH).info["episode"]["l"] == 1


def test_observation_truncate_on_reset_and_step():
    env = ObservationTruncateWrapper(
        ScriptedEnv([TimeStep("y" * 50), TimeStep("short")], first_observation="x" * 20), max_chars=10
    )
    ts = env.reset()
    assert ts.observation == "x" * 10 + "...[truncated]" and ts.info["observation_truncated"] is True
    assert ts.info["observation_chars"] == 20
    assert env.step(WORK).observation == "y" * 10 + "...[truncated]"
    short = env.step(WORK)
    assert short.observation == "short" and "observation_truncated" not in short.info


def test_wrappers_stack_and_keep_the_inner_timestep_unchanged():
    inner_ts = TimeStep("z" * 100, info={"exit_code": 0})
    env = ObservationTruncateWrapper(MaxStepsWrapper(ScriptedEnv([inner_ts]), 1), max_chars=5)
    env.reset()
    ts = env.step(WORK)
    assert ts.truncated and ts.observation.startswith("zzzzz...")
    assert inner_ts.observation == "z" * 100 and not inner_ts.truncated and inner_ts.info == {"exit_code": 0}
    assert env.domain == "scripted" and isinstance(env.unwrapped, ScriptedEnv)

"""Scripted agents for load runs and system tests: fixed policies acting in the product's own
environments (`producers/envs`: `calc` and the conversation domains), every episode recorded by the
env recorder (`RecorderWrapper`, through the SDK). No model and no network, so a step costs what the
env and the SDK cost and the load bench can offer thousands of steps per second.

A policy's `skill` is the chance that its next action is useful (use the calculator, then submit
its result; look something up, then answer with what the task expects); otherwise it wastes a turn
or answers wrongly. Success is the env's verifier's, so the leaderboard separates the policies
(strong > medium > weak) and group rollouts of one task still differ (GRPO needs that).
Deterministic in (task, policy, seed).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producers.envs.protocol import EnvWrapper, TimeStep
from producers.envs.tasks import Task
from producers.envs.wrappers import MaxStepsWrapper, RecorderWrapper


@dataclass(frozen=True)
class ScriptedPolicy:
    model: str
    skill: float  # 0..1: probability of a useful next action
    agent: str = "scripted-agent"


POLICIES = (
    ScriptedPolicy("scripted-strong", 0.9),
    ScriptedPolicy("scripted-medium", 0.7),
    ScriptedPolicy("scripted-weak", 0.45),
)

TASK_FILES = ("calc", "conversation")
MAX_TURNS = 4


def tasks(count: int) -> list[Task]:
    """`count` tasks, cycling through the built-in calc and conversation tasks taken in turn (so a
    few tasks already cover several domains); ids made unique."""
    import producers.envs  # noqa: F401  (registers the built-in environments)
    from producers.envs.tasks import builtin_tasks

    files = [builtin_tasks(name) for name in TASK_FILES]
    base = [f[i] for i in range(max(map(len, files))) for f in files if i < len(f)]
    return [_renamed(base[i % len(base)], f"{base[i % len(base)].task_id}-{i}") for i in range(count)]


def _renamed(task: Task, task_id: str) -> Task:
    return Task(task_id, task.env, task.task, task.domain)


@dataclass(frozen=True)
class Played:
    trajectory_id: str
    steps: int
    success: bool


def play(
    recorder,
    task: Task,
    policy: ScriptedPolicy,
    seed: int,
    group_id: str,
    trajectory_id: str | None = None,
    padding: str = "",
) -> Played:
    """One recorded episode of `policy` on `task` (`padding` is appended to every observation)."""
    rng = random.Random(f"{task.task_id}|{policy.model}|{seed}")
    inner = task.make_env()
    padded = _PaddedObservations(MaxStepsWrapper(inner, MAX_TURNS), padding)
    env = RecorderWrapper(padded, _NamedEpisodes(recorder, trajectory_id), group_id=group_id)
    with env:
        ts = env.reset(task=task.reset_task, seed=seed)
        recorded_id = env.episode.trajectory_id
        agent = _Agent(task, rng, policy.skill)
        steps = 0
        while not ts.done:
            ts = env.step(agent.act(ts))
            steps += 1
        return Played(recorded_id, steps, bool(inner.verify()))


class _Agent:
    """The scripted policy: a two-stage plan per env kind, with mistakes at `1 - skill`."""

    def __init__(self, task: Task, rng: random.Random, skill: float):
        self.task, self.rng, self.skill = task, rng, skill
        self.stage = 0
        self.found = ""  # what the first stage observed (the calculator's result)

    def act(self, ts: TimeStep) -> dict[str, Any]:
        if self.stage == 1 and not self.found:
            self.found = ts.observation.split("\n", 1)[0]
        if self.rng.random() >= self.skill:
            return self._mistake()
        self.stage += 1
        return self._useful(self.stage)

    def _useful(self, stage: int) -> dict[str, Any]:
        if self.task.env == "calc":
            if stage == 1:
                return _action("calculator", {"expression": self.task.task["expression"]}, "Compute it.")
            return _action("submit", {"answer": self.found}, "Submit the calculator's result.")
        if stage == 1:
            return _action("think", {"text": "What does the user need?"}, "Plan the answer.")
        expected = self.task.task.get("expected", "")
        return _action(self._terminal(), {"text": f"The answer: {expected}."}, "Answer.")

    def _mistake(self) -> dict[str, Any]:
        guess = self.rng.random() < 0.5
        if self.task.env == "calc":
            if guess:
                return _action("submit", {"answer": str(self.rng.randint(0, 99))}, "Guess.")
            return _action("calculator", {"expression": "1 +"}, "Try something.")
        if guess:
            return _action(self._terminal(), {"text": "Please wait."}, "Reply quickly.")
        return _action("think", {"text": "Hmm."}, "Think again.")

    def _terminal(self) -> str:
        return {"conversation": "respond", "discussion": "respond"}.get(self.task.env, "submit")


def _action(tool: str, params: dict, thought: str) -> dict[str, Any]:
    return {"tool": tool, "params": params, "thought": thought}


class _PaddedObservations(EnvWrapper):
    """Appends `padding` to every observation: the load bench's event size."""

    def __init__(self, env, padding: str):
        super().__init__(env)
        self.padding = padding

    def reset(self, *, task: Any = None, seed: int | None = None) -> TimeStep:
        return self._pad(self.env.reset(task=task, seed=seed))

    def step(self, action) -> TimeStep:
        return self._pad(self.env.step(action))

    def _pad(self, ts: TimeStep) -> TimeStep:
        if self.padding:
            ts.observation += "\n" + self.padding
        return ts


class _NamedEpisodes:
    """The recorder, with the next episode's trajectory id chosen by the caller (the load bench
    finds its episodes by an id prefix); everything else goes to the recorder."""

    def __init__(self, recorder, trajectory_id: str | None):
        self.recorder, self.trajectory_id = recorder, trajectory_id

    def episode(self, **kwargs):
        return self.recorder.episode(trajectory_id=self.trajectory_id, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.recorder, name)


@dataclass(frozen=True)
class Planned:
    """One episode to play: which task, which policy, its seed and its GRPO group."""

    task: Task
    policy: ScriptedPolicy
    seed: int
    group_id: str


def plan(episodes: int, group_size: int) -> list[Planned]:
    """Tasks x policies x group rollouts, about `episodes` in total (at least one group per policy)."""
    per_task = len(POLICIES) * group_size
    out = []
    for task in tasks(max(1, math.ceil(episodes / per_task))):
        for policy in POLICIES:
            group_id = f"{task.task_id}/{policy.model}"
            out += [Planned(task, policy, seed, group_id) for seed in range(group_size)]
    return out[: max(episodes, per_task)]


def run_agents(planned: list[Planned], bootstrap: str, data_dir: Path) -> list[Played]:
    """Play and record every planned episode, one SDK recorder per policy (flushed and closed)."""
    from producers.sdk.recorder import AgentRecorder

    recorders = {
        p.model: AgentRecorder(bootstrap_servers=bootstrap, data_dir=data_dir, agent=p.agent, model=p.model)
        for p in POLICIES
    }
    try:
        return [play(recorders[p.policy.model], p.task, p.policy, p.seed, p.group_id) for p in planned]
    finally:
        for recorder in recorders.values():
            recorder.close()

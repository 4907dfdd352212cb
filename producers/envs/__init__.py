"""Agent environments: the protocol (`AgentEnv`, `TimeStep`, `EnvWrapper`), the registry, the
wrappers, task files and the built-in envs, which are registered on import:

| id     | env       | domain | terminal tools |
|--------|-----------|--------|----------------|
| `calc` | `CalcEnv` | math   | submit         |

    from producers.envs import make, RecorderWrapper, MaxStepsWrapper
    env = RecorderWrapper(MaxStepsWrapper(make("calc", difficulty=2), 8), recorder)

`producers.env.RecordedEnv` (Gymnasium-style envs) is separate and unchanged.
"""

from __future__ import annotations

from producers.envs.calc import CalcEnv
from producers.envs.errors import EnvError, ExpressionError
from producers.envs.protocol import Action, AgentEnv, EnvWrapper, TimeStep
from producers.envs.registry import EnvSpec, list_envs, make, register, spec, unregister
from producers.envs.tasks import Task, builtin_tasks, load_tasks
from producers.envs.wrappers import (
    EpisodeStatisticsWrapper,
    MaxStepsWrapper,
    ObservationTruncateWrapper,
    RecorderWrapper,
    RewardFnWrapper,
    TimeoutWrapper,
)

__all__ = [
    "Action",
    "AgentEnv",
    "CalcEnv",
    "EnvError",
    "EnvSpec",
    "EnvWrapper",
    "EpisodeStatisticsWrapper",
    "ExpressionError",
    "MaxStepsWrapper",
    "ObservationTruncateWrapper",
    "RecorderWrapper",
    "RewardFnWrapper",
    "Task",
    "TimeStep",
    "TimeoutWrapper",
    "builtin_tasks",
    "list_envs",
    "load_tasks",
    "make",
    "register",
    "spec",
    "unregister",
]

if spec("calc") is None:  # a reload of this package must not fail on its own registration
    register(
        "calc",
        CalcEnv,
        domain="math",
        description="arithmetic with a calculator tool and a submit tool; difficulty 1-5",
    )

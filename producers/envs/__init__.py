"""Agent environments: the protocol (`AgentEnv`, `TimeStep`, `EnvWrapper`), the registry, the
wrappers, task files and the built-in envs, which are registered on import:

| id             | env               | domain       | terminal tools  |
|----------------|-------------------|--------------|-----------------|
| `calc`         | `CalcEnv`         | math         | submit          |
| `sandbox`      | `SandboxEnv`      | coding       | submit          |
| `conversation` | `ConversationEnv` | conversation | respond         |
| `engineering`  | `ConversationEnv` | engineering  | submit, finish  |
| `advisory`     | `ConversationEnv` | advisory     | submit, finish  |
| `discussion`   | `ConversationEnv` | discussion   | respond, submit |

SWE-bench-style instance files load offline as sandbox tasks with `load_swe_instances`.

    from producers.envs import make, RecorderWrapper, MaxStepsWrapper
    env = RecorderWrapper(MaxStepsWrapper(make("calc", difficulty=2), 8), recorder)

`RecorderWrapper` is the one env recorder. A Gymnasium-style env (`reset`/`step` tuples) is
recorded through the same wrapper once adapted: `RecorderWrapper(GymnasiumEnv(my_env), recorder)`.
"""

from __future__ import annotations

from functools import partial

from producers.envs.calc import CalcEnv
from producers.envs.conversation import ConversationEnv
from producers.envs.errors import EnvError, ExpressionError
from producers.envs.gymnasium_env import GymnasiumEnv, env_action
from producers.envs.protocol import Action, AgentEnv, EnvWrapper, TimeStep
from producers.envs.registry import EnvSpec, list_envs, make, register, spec, unregister
from producers.envs.sandbox_env import SandboxEnv
from producers.envs.swe import load_swe_instances
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
    "ConversationEnv",
    "EnvError",
    "EnvSpec",
    "EnvWrapper",
    "EpisodeStatisticsWrapper",
    "ExpressionError",
    "GymnasiumEnv",
    "MaxStepsWrapper",
    "ObservationTruncateWrapper",
    "RecorderWrapper",
    "RewardFnWrapper",
    "SandboxEnv",
    "Task",
    "TimeStep",
    "TimeoutWrapper",
    "builtin_tasks",
    "env_action",
    "list_envs",
    "load_swe_instances",
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

if spec("sandbox") is None:
    register(
        "sandbox",
        SandboxEnv,
        domain="coding",
        description="a coding task in a sandbox workspace (file, shell, search, git), verified by tests",
    )

_CONVERSATION_DESCRIPTIONS = {
    "conversation": "a dialogue with respond and mock lookup tools; ends on respond",
    "engineering": "an engineering dialogue with mock read_file/grep/bash/git tools; ends on submit/finish",
    "advisory": "an advisory dialogue with mock knowledge_base/web_search tools; ends on submit/finish",
    "discussion": "a discussion with a mock knowledge_base tool; ends on respond or submit",
}
for _domain, _description in _CONVERSATION_DESCRIPTIONS.items():
    if spec(_domain) is None:
        register(_domain, partial(ConversationEnv, domain=_domain), domain=_domain, description=_description)

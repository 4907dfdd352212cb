"""Trajectory -> OpenAI-style chat messages (the text layer every trainer reads).

A step becomes one assistant turn (the thought as `content`, the tool call as `tool_calls` with JSON
`arguments`) and, when the step called a tool, one `tool` turn carrying the observation. A step
without a tool is a final answer: an assistant turn with content only (its observation, if any,
follows as a `user` turn). Pure functions, no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from schemas.events import ScoredStep, TrajectoryScored

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent. Think, then call one tool per turn; observations come back as tool turns."
)

Message = dict[str, Any]


def call_id(step: ScoredStep) -> str:
    """A stable tool-call id for a step: `call_<step_index>`."""
    return f"call_{step.step_index}"


def assistant_message(step: ScoredStep) -> Message:
    """The assistant turn of a step (thought + tool call).

    >>> from schemas.events import ScoredStep
    >>> step = ScoredStep(step_index=0, thought="look", tool="ls", params={"p": "."})
    >>> assistant_message(step)["tool_calls"]
    [{'id': 'call_0', 'type': 'function', 'function': {'name': 'ls', 'arguments': '{"p": "."}'}}]
    """
    message: Message = {"role": "assistant", "content": step.thought}
    if step.tool:
        arguments = json.dumps(step.params, sort_keys=True, ensure_ascii=False)
        function = {"name": step.tool, "arguments": arguments}
        message["tool_calls"] = [{"id": call_id(step), "type": "function", "function": function}]
    return message


def observation_text(step: ScoredStep) -> str:
    """What the environment answered, with the error appended when there was one."""
    if step.error:
        return f"{step.observation}\n[error] {step.error}" if step.observation else f"[error] {step.error}"
    return step.observation


def observation_message(step: ScoredStep) -> Message | None:
    """The turn carrying a step's observation, or None when there is nothing to show."""
    text = observation_text(step)
    if step.tool:
        return {"role": "tool", "tool_call_id": call_id(step), "name": step.tool, "content": text}
    return {"role": "user", "content": text} if text else None


def step_messages(step: ScoredStep) -> list[Message]:
    """Assistant turn, then the observation turn (if any)."""
    observation = observation_message(step)
    return [assistant_message(step)] + ([observation] if observation else [])


def prompt_messages(
    trajectory: TrajectoryScored, system_prompt: str = DEFAULT_SYSTEM_PROMPT
) -> list[Message]:
    """System prompt and the user task: the context every chunk and every pair starts from."""
    task = trajectory.task or f"Solve task {trajectory.task_id}."
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*system, {"role": "user", "content": task}]


def trajectory_messages(
    trajectory: TrajectoryScored, system_prompt: str = DEFAULT_SYSTEM_PROMPT, max_steps: int | None = None
) -> list[Message]:
    """The whole conversation: prompt, then every step (or the first `max_steps`)."""
    steps = ordered_steps(trajectory)[:max_steps]
    return prompt_messages(trajectory, system_prompt) + [m for s in steps for m in step_messages(s)]


def ordered_steps(trajectory: TrajectoryScored) -> list[ScoredStep]:
    """Steps in `step_index` order (the assembler sends them ordered; do not rely on it)."""
    return sorted(trajectory.steps, key=lambda s: s.step_index)


def tool_schemas(trajectories: list[TrajectoryScored]) -> list[dict[str, Any]]:
    """OpenAI function schemas for every tool the trajectories used, parameters inferred from values.

    >>> from schemas.events import ScoredStep, TrajectoryScored
    >>> t = TrajectoryScored(event_id="e", trajectory_id="t", occurred_at="2026-01-01T00:00:00Z",
    ...     producer="p", task_id="k", steps=[ScoredStep(step_index=0, tool="ls", params={"path": "."})])
    >>> tool_schemas([t])[0]["function"]["parameters"]["properties"]
    {'path': {'type': 'string'}}
    """
    params: dict[str, dict[str, str]] = {}
    for trajectory in trajectories:
        for step in trajectory.steps:
            if step.tool:
                seen = params.setdefault(step.tool, {})
                for name, value in step.params.items():
                    seen.setdefault(name, _json_type(value))
    return [_function_schema(name, params[name]) for name in sorted(params)]


def _function_schema(name: str, properties: dict[str, str]) -> dict[str, Any]:
    props = {key: {"type": properties[key]} for key in sorted(properties)}
    parameters = {"type": "object", "properties": props}
    return {"type": "function", "function": {"name": name, "description": "", "parameters": parameters}}


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "string"

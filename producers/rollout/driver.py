"""`agentstream rollout`: episodes of an environment against any OpenAI-compatible policy endpoint.

For each task of the set (an env's built-in tasks, or a JSONL file), `group_size` rollouts share a
`group_id` (what GRPO compares); `concurrency` episodes run at once. One episode: reset the env
(wrapped so the interaction stops at `max_turns` and every step is recorded through the SDK, with
success decided by the env's verifier), then ask the policy for an action per turn (the env's tools
offered as OpenAI tools), step the env with it, and give the observation back as the tool's answer.
A reply without a tool call is the final answer: it goes to the env's terminal tool.

Steps are recorded once, by the SDK in the env wrapper (the policy is called on its plain route, so
the policy server does not record them a second time). By default the task set is run once;
`forever` keeps sampling (what the training loop needs).
"""

from __future__ import annotations

import json
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from producers.envs.protocol import TimeStep
from producers.envs.tasks import Task
from producers.envs.wrappers import MaxStepsWrapper, RecorderWrapper

log = logging.getLogger(__name__)

SYSTEM_PROMPT = "You are an agent. Use the tools to solve the task; call `{terminal}` with your final answer."


@dataclass(frozen=True)
class RolloutConfig:
    """How `agentstream rollout` samples. Documented fields are its options."""

    env: str = field(default="calc", metadata={"help": "environment id (agentstream envs: calc, ...)"})
    policy_url: str = field(
        default="http://127.0.0.1:8000/v1",
        metadata={"help": "OpenAI-compatible policy endpoint", "env": "AGENTSTREAM_ROLLOUT_POLICY_URL"},
    )
    model: str = field(default="policy", metadata={"help": "model id to ask the endpoint for"})
    tasks: str = field(default="", metadata={"help": "JSONL task file (default: the env's built-in tasks)"})
    group_size: int = field(default=4, metadata={"help": "rollouts per task sharing one group_id"})
    concurrency: int = field(default=4, metadata={"help": "episodes run at once"})
    max_turns: int = field(default=8, metadata={"help": "interaction turns per episode (then truncated)"})
    max_tokens: int = field(default=128, metadata={"help": "tokens per policy reply"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    forever: bool = field(default=False, metadata={"help": "keep sampling the task set (training loop)"})
    api_key: str = field(
        default="none", metadata={"help": "API key for the endpoint", "env": "AGENTSTREAM_ROLLOUT_API_KEY"}
    )


@dataclass(frozen=True)
class EpisodeResult:
    task_id: str
    group_id: str
    trajectory_id: str
    success: bool
    turns: int
    truncated: bool


def tool_specs(tools: list[str]) -> list[dict]:
    """The env's tools as OpenAI function tools (arguments: a free-form object)."""
    return [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}} for name in tools
    ]


def action_from(choice, terminal: str) -> tuple[dict, str | None]:
    """The env action of a policy reply and the id of the tool call it answers (None: no call)."""
    calls = choice.message.tool_calls or []
    if calls:
        call = calls[0]
        try:
            params = json.loads(call.function.arguments or "{}")
        except json.JSONDecodeError:
            params = {"raw": call.function.arguments}
        thought = choice.message.content or ""
        return {
            "tool": call.function.name,
            "params": params if isinstance(params, dict) else {},
            "thought": thought,
        }, call.id
    return {"tool": terminal, "params": {"answer": (choice.message.content or "").strip()}}, None


def run_episode(
    client, config: RolloutConfig, task: Task, recorder, group_id: str, seed: int
) -> EpisodeResult:
    """One episode of `task` (see the module docstring)."""
    inner = task.make_env()
    terminal = sorted(inner.terminal_tools)[0]
    env = RecorderWrapper(MaxStepsWrapper(inner, config.max_turns), recorder, group_id=group_id)
    with env:
        ts = env.reset(task=task.reset_task, seed=seed)
        trajectory_id = env.episode.trajectory_id
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT.format(terminal=terminal)},
            {"role": "user", "content": ts.observation},
        ]
        turns = 0
        while not ts.done:
            ts = _turn(client, config, env, messages, terminal, seed + turns)
            turns += 1
        return EpisodeResult(task.task_id, group_id, trajectory_id, bool(inner.verify()), turns, ts.truncated)


def _turn(client, config: RolloutConfig, env, messages: list[dict], terminal: str, seed: int) -> TimeStep:
    reply = client.chat.completions.create(
        model=config.model,
        messages=messages,
        tools=tool_specs(env.available_tools),
        max_tokens=config.max_tokens,
        temperature=config.temperature,
        seed=seed,
    )
    choice = reply.choices[0]
    action, call_id = action_from(choice, terminal)
    ts = env.step(action)
    assistant: dict[str, Any] = {"role": "assistant", "content": choice.message.content or ""}
    if call_id is not None:
        assistant["tool_calls"] = [call.model_dump() for call in choice.message.tool_calls[:1]]
        messages += [assistant, {"role": "tool", "tool_call_id": call_id, "content": ts.observation}]
    else:
        messages += [assistant, {"role": "user", "content": ts.observation}]
    return ts


def run(config: RolloutConfig, tasks: list[Task], recorder, progress=None) -> list[EpisodeResult]:
    """Every task `group_size` times (once through the set, or until interrupted with `forever`)."""
    from openai import OpenAI

    client = OpenAI(base_url=config.policy_url, api_key=config.api_key, max_retries=2, timeout=300)
    results: list[EpisodeResult] = []
    rounds = 0
    while True:
        jobs = [(task, f"{task.task_id}-g{uuid.uuid4().hex[:8]}") for task in tasks]
        with ThreadPoolExecutor(config.concurrency, thread_name_prefix="agentstream-rollout") as pool:
            futures = [
                pool.submit(run_episode, client, config, task, recorder, group_id, rounds * 1000 + index)
                for task, group_id in jobs
                for index in range(config.group_size)
            ]
            for future in futures:
                results.append(future.result())
                if progress is not None:
                    progress(results[-1])
        rounds += 1
        if not config.forever:
            return results

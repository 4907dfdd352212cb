"""`agentstream rollout`: episodes of an environment against any OpenAI-compatible policy endpoint.

For each task of the set (an env's built-in tasks, or a JSONL file), `group_size` rollouts share a
`group_id` (what GRPO compares); `concurrency` episodes run at once. One episode: reset the env
(wrapped so the interaction stops at `max_turns` and every step is recorded through the SDK, with
success decided by the env's verifier), then ask the policy for an action per turn (the env's tools
offered as OpenAI tools), step the env with it, and give the observation back as the tool's answer.
A reply without a tool call is the final answer: it goes to the env's terminal tool. With `env_url`
the env is a session of a served environment (`agentstream env serve`, `RemoteEnv`) instead of one
made in-process; the episode, its recording and its verdict are the same.

Steps are recorded once, by the SDK in the env wrapper. The policy is asked in client-records mode
(headers `X-Agentstream-Trajectory`, `X-Agentstream-Step-Index`, `X-Agentstream-Record: client`):
our policy server keeps the episode's token context but does not publish the step; it returns the
step's token fields (token ids, logprobs, prompt delta, continuity, policy_version) in the reply's
`agentstream` object, and the wrapper records them with the observation in one `step.recorded`.
Another OpenAI-compatible endpoint ignores the headers: its steps are recorded without token ids.
By default the task set is run once;
`forever` keeps sampling (what the training loop needs).

Training-loop controls (both off by default, both need the broker): `horizon` is a ScalingInter-RL
schedule (producers/rollout/horizon.py): before each episode the newest policy's training step is
read from `policy.updates` and the episode's turn limit is min(max_turns, horizon at that step),
enforced while it runs and recorded in the episode's metadata. `max_staleness` pauses sampling while
the trainer has more than that many batches not yet trained (producers/rollout/backpressure.py).
"""

from __future__ import annotations

import json
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from producers.envs.protocol import AgentEnv, TimeStep
from producers.envs.service.wire import parse_env_args
from producers.envs.tasks import Task
from producers.envs.wrappers import MaxStepsWrapper, RecorderWrapper
from producers.errors import ProducerError
from producers.rollout.backpressure import BackpressureGate, TopicBacklog
from producers.rollout.horizon import PolicyProgress, parse_horizon

log = logging.getLogger(__name__)

VERSION_HEADER = "x-agentstream-policy-version"  # the policy server's; producers/policy/server.py

SYSTEM_PROMPT = "You are an agent. Use the tools to solve the task; call `{terminal}` with your final answer."


@dataclass(frozen=True)
class RolloutConfig:
    """How `agentstream rollout` samples. Documented fields are its options."""

    env: str = field(default="calc", metadata={"help": "environment id (agentstream envs: calc, ...)"})
    env_url: str = field(
        default="",
        metadata={
            "help": "a served environment (`agentstream env serve NAME`, e.g. http://127.0.0.1:8765) to "
            "step instead of an in-process one",
            "env": "AGENTSTREAM_ROLLOUT_ENV_URL",
        },
    )
    env_args: str = field(
        default="",
        metadata={
            "help": 'JSON object of env keyword arguments, e.g. \'{"backend": "local"}\'',
            "env": "AGENTSTREAM_ROLLOUT_ENV_ARGS",
        },
    )
    env_api_key: str = field(
        default="",
        metadata={
            "help": "API key for --env-url (when it wants one)",
            "env": "AGENTSTREAM_ROLLOUT_ENV_API_KEY",
        },
    )
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
    seed: int = field(
        default=0,
        metadata={"help": "run seed: episode k of round r samples with seed SEED*1000000 + r*1000 + k"},
    )
    forever: bool = field(default=False, metadata={"help": "keep sampling the task set (training loop)"})
    api_key: str = field(
        default="none", metadata={"help": "API key for the endpoint", "env": "AGENTSTREAM_ROLLOUT_API_KEY"}
    )
    horizon: str = field(
        default="",
        metadata={
            "help": "turn-limit schedule by training step, STEP=TURNS stages like 0=4,100=8 (off: max_turns)"
        },
    )
    max_staleness: int = field(
        default=0, metadata={"help": "pause while the trainer is more than N batches behind (0: off)"}
    )
    max_ahead: int = field(
        default=0,
        metadata={"help": "pause after N episodes until the executor finishes another batch (0: off)"},
    )
    progress_poll_s: float = field(
        default=5.0, metadata={"help": "seconds between reads of policy.updates / training.batches"}
    )

    def __post_init__(self):
        parse_horizon(self.horizon)  # a bad schedule fails here, naming the value
        parse_env_args(self.env_args, "--env-args")
        if self.env_url and not self.env_url.startswith(("http://", "https://")):
            raise ProducerError(f"--env-url: expected http(s)://host:port, got {self.env_url!r}")
        if self.max_turns < 1:
            raise ProducerError(f"--max-turns: must be >= 1, got {self.max_turns!r}")
        if self.max_staleness < 0:
            raise ProducerError(f"--max-staleness: must be >= 0, got {self.max_staleness!r}")
        if self.max_ahead < 0:
            raise ProducerError(f"--max-ahead: must be >= 0, got {self.max_ahead!r}")
        if self.progress_poll_s <= 0:
            raise ProducerError(f"--progress-poll-s: must be > 0, got {self.progress_poll_s!r}")

    def make_env(self, task: Task) -> AgentEnv:
        """The env of one episode of `task`: a session of `env_url`, else made in-process; both with
        `env_args`."""
        kwargs = parse_env_args(self.env_args, "--env-args")
        if not self.env_url:
            return task.make_env(**kwargs)
        from producers.envs.service.client import RemoteEnv

        return RemoteEnv(self.env_url, task.env, kwargs=kwargs, api_key=self.env_api_key or None)

    def turn_limit(self, progress: int) -> int:
        """Turns allowed to an episode started at training step `progress`."""
        schedule = parse_horizon(self.horizon)
        return min(self.max_turns, schedule.horizon_at(progress)) if schedule else self.max_turns


@dataclass(frozen=True)
class EpisodeResult:
    task_id: str
    group_id: str
    trajectory_id: str
    success: bool
    turns: int
    truncated: bool
    horizon: int = 0
    """The turn limit this episode ran under."""
    seed: int = 0
    """The episode's sampling seed (turn t asks the policy with seed + t)."""
    reward: float = 0.0
    """The env's return: the sum of its step rewards."""


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
    client, config: RolloutConfig, task: Task, recorder, group_id: str, seed: int, progress: int = 0
) -> EpisodeResult:
    """One episode of `task` (see the module docstring), limited to `config.turn_limit(progress)`
    turns: the step that reaches the limit is truncated and success is what the verifier sees."""
    inner = config.make_env(task)
    terminal = sorted(inner.terminal_tools)[0]
    horizon = config.turn_limit(progress)
    metadata = {"horizon": horizon, "max_turns": config.max_turns, "training_step": progress}
    env = RecorderWrapper(
        MaxStepsWrapper(inner, horizon),
        recorder,
        group_id=group_id,
        metadata=metadata,
        policy_version=serving_version(client),
    )
    with env:
        ts = env.reset(task=task.reset_task, seed=seed)
        trajectory_id = env.episode.trajectory_id
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT.format(terminal=terminal)},
            {"role": "user", "content": ts.observation},
        ]
        turns, reward = 0, 0.0
        while not ts.done:
            ts = _turn(client, config, env, messages, terminal, seed + turns, turns)
            turns, reward = turns + 1, reward + ts.reward
        success = bool(inner.verify())
        return EpisodeResult(
            task.task_id, group_id, trajectory_id, success, turns, ts.truncated, horizon, seed, reward
        )


def serving_version(client) -> str | None:
    """The policy version the endpoint serves now (our server's header on `/models`), else None."""
    try:
        raw = client.models.with_raw_response.list()
    except Exception as exc:  # an endpoint without /models still serves completions
        log.debug("policy endpoint: no /models (%s); episode policy_version left to the recorder", exc)
        return None
    return raw.headers.get(VERSION_HEADER) or None


def client_record_headers(trajectory_id: str, step_index: int) -> dict[str, str]:
    """Headers asking our policy server for the step's token fields instead of recording it."""
    return {
        "X-Agentstream-Trajectory": trajectory_id,
        "X-Agentstream-Step-Index": str(step_index),
        "X-Agentstream-Record": "client",
    }


def recorded_fields(reply) -> dict[str, Any] | None:
    """The reply's `agentstream` object (our policy server), None from another endpoint."""
    fields = (getattr(reply, "model_extra", None) or {}).get("agentstream")
    return fields if isinstance(fields, dict) else None


def _turn(
    client, config: RolloutConfig, env, messages: list[dict], terminal: str, seed: int, step_index: int
) -> TimeStep:
    reply = client.chat.completions.create(
        model=config.model,
        messages=messages,
        tools=tool_specs(env.available_tools),
        max_tokens=config.max_tokens,
        temperature=config.temperature,
        seed=seed,
        extra_headers=client_record_headers(env.episode.trajectory_id, step_index),
    )
    choice = reply.choices[0]
    action, call_id = action_from(choice, terminal)
    ts = env.step(action, recorded_fields(reply))
    assistant: dict[str, Any] = {"role": "assistant", "content": choice.message.content or ""}
    if call_id is not None:
        assistant["tool_calls"] = [call.model_dump() for call in choice.message.tool_calls[:1]]
        messages += [assistant, {"role": "tool", "tool_call_id": call_id, "content": ts.observation}]
    else:
        messages += [assistant, {"role": "user", "content": ts.observation}]
    return ts


class TrainingLoopControls:
    """What the driver reads before each episode: the training step (for the horizon) and the
    backpressure gate. Built from the config; without a broker both are off."""

    def __init__(self, progress: PolicyProgress | None = None, gate: BackpressureGate | None = None):
        self.progress, self.gate = progress, gate

    @classmethod
    def from_config(cls, config: RolloutConfig, bootstrap_servers: str | None) -> TrainingLoopControls:
        if not (config.horizon or config.max_staleness or config.max_ahead):
            return cls()
        if not bootstrap_servers:
            raise ProducerError(
                "--horizon / --max-staleness / --max-ahead: need the broker (bootstrap servers), got none"
            )
        progress = PolicyProgress(bootstrap_servers, config.progress_poll_s) if config.horizon else None
        gate = None
        if config.max_staleness or config.max_ahead:
            gate = BackpressureGate(
                TopicBacklog(bootstrap_servers),
                config.max_staleness,
                config.progress_poll_s,
                max_ahead=config.max_ahead,
            )
        return cls(progress, gate)

    def before_episode(self) -> int:
        """Wait out backpressure, then the training step the episode starts at."""
        if self.gate is not None:
            self.gate.wait()
        return self.progress.step() if self.progress is not None else 0

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
        if self.gate is not None:
            self.gate.backlog.close()


def _controlled_episode(controls: TrainingLoopControls, client, config, task, recorder, group_id, seed):
    return run_episode(client, config, task, recorder, group_id, seed, controls.before_episode())


def run(
    config: RolloutConfig,
    tasks: list[Task],
    recorder,
    progress=None,
    *,
    bootstrap_servers: str | None = None,
    controls: TrainingLoopControls | None = None,
) -> list[EpisodeResult]:
    """Every task `group_size` times (once through the set, or until interrupted with `forever`).
    `bootstrap_servers` is needed for `horizon` / `max_staleness` (or pass `controls`)."""
    from openai import OpenAI

    client = OpenAI(base_url=config.policy_url, api_key=config.api_key, max_retries=2, timeout=300)
    controls = controls or TrainingLoopControls.from_config(config, bootstrap_servers)
    try:
        return _run_rounds(client, config, tasks, recorder, progress, controls)
    finally:
        controls.close()


def run_recorded(
    config: RolloutConfig,
    tasks: list[Task],
    bootstrap_servers: str,
    data_dir: str,
    progress=None,
    close_timeout_s: float = 60.0,
) -> list[EpisodeResult]:
    """`run` with its own SDK recorder (agent "rollout", the config's model) under `data_dir`,
    closed (its spool delivered, up to `close_timeout_s`) whatever happens."""
    from pathlib import Path

    from producers.sdk.recorder import AgentRecorder

    recorder = AgentRecorder(bootstrap_servers, Path(data_dir), agent="rollout", model=config.model)
    try:
        return run(config, tasks, recorder, progress, bootstrap_servers=bootstrap_servers)
    finally:
        recorder.close(timeout=close_timeout_s)


def _run_rounds(client, config, tasks, recorder, progress, controls) -> list[EpisodeResult]:
    results: list[EpisodeResult] = []
    rounds = 0
    while True:
        jobs = [(task, f"{task.task_id}-g{uuid.uuid4().hex[:8]}") for task in tasks]
        with ThreadPoolExecutor(config.concurrency, thread_name_prefix="agentstream-rollout") as pool:
            futures = [
                pool.submit(
                    _controlled_episode,
                    controls,
                    client,
                    config,
                    task,
                    recorder,
                    group_id,
                    config.seed * 1_000_000 + rounds * 1000 + index,
                )
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

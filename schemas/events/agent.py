"""`agent.events`: what an agent did in one episode: it started, each step, it ended."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.bounded import (
    Count,
    Id,
    Int64,
    JsonDict,
    JsonItem,
    Logprobs,
    NonNegFloat,
    Score,
    StepCount,
    StepIndex,
    Text,
    TokenIds,
)
from schemas.events.envelope import PURPOSE_HELP, REDACTIONS_HELP, EventBase, Purpose
from schemas.limits import MAX_STEPS


class EpisodeStarted(EventBase):
    type: Literal["episode.started"] = "episode.started"
    task_id: Id = Field(min_length=1)
    task: Text = Field("", description="the instruction given to the agent")
    domain: Id = "generic"
    agent: Id = ""
    model: Id = ""
    policy_version: Id | None = None
    group_id: Id | None = Field(None, description="rollouts of one task sampled together (GRPO groups)")
    reference_steps: StepCount | None = Field(None, description="reference step count, for efficiency")
    metadata: JsonDict = Field(default_factory=dict)
    redactions: Count = Field(0, description=REDACTIONS_HELP)
    purpose: Purpose = Field("train", description=PURPOSE_HELP)


class StepAction(BaseModel):
    """What the agent did at one step and what it saw: the fields `step.recorded` carries and
    `trajectory.scored` repeats per step (`ScoredStep`), in this order."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)

    step_index: StepIndex
    thought: Text = ""
    tool: Id = ""
    params: JsonDict = Field(default_factory=dict)
    observation: Text = ""
    exit_code: Int64 | None = None
    error: Text | None = None


# StepAction first: pydantic orders fields base by base from the last one, so the envelope comes first.
class StepRecorded(StepAction, EventBase):
    type: Literal["step.recorded"] = "step.recorded"
    model: Id = ""
    policy_version: Id | None = None
    input_tokens: Count | None = None
    output_tokens: Count | None = None
    latency_ms: NonNegFloat | None = None
    token_ids: TokenIds | None = Field(None, description="sampled token ids, for on-policy RL")
    logprobs: Logprobs | None = Field(None, description="logprobs of token_ids, same length")
    reward: float | None = Field(None, description="environment reward for this step (Gymnasium-style envs)")
    # Recorded by the policy server (token-in/token-out); absent for steps recorded elsewhere.
    prompt_token_ids: TokenIds | None = Field(
        None,
        description="the prompt's token ids as a delta: the tokens from prompt_delta_start on "
        "(the whole prompt on an episode's first turn)",
    )
    prompt_delta_start: Count | None = Field(
        None,
        description="where the delta starts in the previous turn's prompt + completion tokens: the "
        "prompt the model saw is that context[:prompt_delta_start] + prompt_token_ids",
    )
    sampling: JsonDict | None = Field(None, description="sampling parameters of the completion")
    tokenizer_hash: Id | None = Field(None, description="hash of the tokenizer and chat template")
    token_continuity: Literal["first", "ok", "broken"] | None = Field(
        None,
        description="first: no previous turn known; ok: the prompt extends the previous prompt + "
        "completion token for token; broken: it does not (history re-rendered), see token_continuity_break",
    )
    token_continuity_break: Count | None = Field(
        None, description="first position where the prompt differs from the previous context"
    )
    token_rl_eligible: bool | None = Field(
        None, description="false when the token history is broken: fine for SFT, not for token-level RL"
    )
    finish_reason: Id | None = Field(None, description="stop | length | tool_calls")
    tool_call_malformed: bool | None = Field(
        None, description="the model wrote a tool call that could not be parsed; returned as text"
    )
    samples: Annotated[list[JsonItem], Field(max_length=MAX_STEPS)] | None = Field(
        None, description="n > 1: the other samples ({token_ids, logprobs, finish_reason, text})"
    )
    redactions: Count = Field(0, description=REDACTIONS_HELP)


class EpisodeEnded(EventBase):
    type: Literal["episode.ended"] = "episode.ended"
    success: bool
    score: Score | None = None
    tests_passed: StepCount | None = None
    tests_failed: StepCount | None = None
    terminated: bool = True
    truncated: bool = False
    total_steps: StepCount | None = None
    error: Text | None = Field(None, description="why the episode failed, when it raised")
    input_tokens: Count | None = Field(None, description="episode total, when the producer knows it")
    output_tokens: Count | None = Field(None, description="episode total, when the producer knows it")
    cost_usd: NonNegFloat | None = Field(None, description="model cost of the episode, when known")
    outcome_source: Id | None = Field(
        None, description="where success/score came from (e.g. 'info.exit_status'); 'unknown': not stated"
    )
    redactions: Count = Field(0, description=REDACTIONS_HELP)

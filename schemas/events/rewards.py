"""The automatic reward layers: `reward.rule` (rule scores per step) and `reward.judge` (LLM judge
scores per step or trajectory, and the judge's failures)."""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, Field

from schemas.bounded import Count, NonNegFloat, Score, StepIndex
from schemas.events.envelope import EventBase


class RuleRewardStep(EventBase):
    type: Literal["reward.rule.step"] = "reward.rule.step"
    step_index: StepIndex
    redundancy: Score | None = None
    regression: Score | None = None
    info_utilization: Score | None = None
    score: Score | None = Field(None, description="weighted mean of the present components; None if none")
    domain: str = "generic"
    reward_version: str
    source_event_id: str


class _JudgeCost(EventBase):
    judge_model: str
    prompt_version: str
    input_tokens: Count = 0
    output_tokens: Count = 0
    cost_usd: NonNegFloat = 0.0
    latency_ms: NonNegFloat = 0.0
    cached: bool = False


class JudgeStep(_JudgeCost):
    type: Literal["reward.judge.step"] = "reward.judge.step"
    step_index: StepIndex
    scores: dict[str, Score] = Field(default_factory=dict, description="rubric -> score; unscored = absent")
    score: Score | None = None
    rationale: str = ""
    source_event_id: str | None = None


class JudgeTrajectory(_JudgeCost):
    type: Literal["reward.judge.trajectory"] = "reward.judge.trajectory"
    scores: dict[str, Score] = Field(default_factory=dict)
    score: Score | None = None
    rationale: str = ""
    group_id: str | None = None
    mode: Literal["trajectory", "group"] = "trajectory"


class JudgeFailed(EventBase):
    type: Literal["reward.judge.failed"] = "reward.judge.failed"
    reason: str
    kind: Literal["error", "parse", "budget_paused", "circuit_open"] = "error"
    step_index: StepIndex | None = None
    judge_model: str = ""
    prompt_version: str = ""
    attempts: Count = 0
    retry_at: AwareDatetime | None = None
    input_tokens: Count = Field(0, description="tokens paid for a reply that could not be used")
    output_tokens: Count = 0
    cost_usd: NonNegFloat = 0.0

"""The event contract: one frozen pydantic model per event type, and `Event`, their union on `type`.

Rules (README, "Versioning"):
- Every event carries the envelope: `event_id`, `type`, `schema_version`, `trajectory_id`,
  `occurred_at` (timezone-aware, normalised to UTC) and `producer`. Payload fields sit beside them.
- Models read tolerantly: unknown fields are ignored, and fields added after 1.0 are optional, so an
  older `schema_version` decodes. A newer *major* version is refused by the codec.
- `None` means "absent / no signal", never a neutral value: a reward layer without a signal is None.
- Field names are fixed by ARCHITECTURE.md; add fields freely, never rename.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from schemas.bounded import (
    ByteCount,
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
from schemas.limits import MAX_STEPS

SCHEMA_MAJOR = 1
# 1.1: `redactions` on the events that carry free text (issue #18)
# 1.2: reward layers on `trajectory.scored`: per step `layers` / `missing_layers`, and the
#      trajectory's `reward_definition` (issue #17)
# 1.3: bounds on the fields that size work (`schemas.limits`); dead.letter's payload summary (#34)
SCHEMA_VERSION = f"{SCHEMA_MAJOR}.3"

REDACTIONS_HELP = "secrets replaced by a [REDACTED:<detector>] placeholder before publishing (since 1.1)"


def utc_now() -> datetime:
    return datetime.now(UTC)


class EventBase(BaseModel):
    """The envelope every event carries."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False, populate_by_name=True)

    event_id: Id = Field(min_length=1, description="unique; derived events use a deterministic id")
    type: str
    schema_version: str = Field(SCHEMA_VERSION, pattern=r"^\d+\.\d+$", max_length=32)
    trajectory_id: Id = Field(min_length=1, description="partition key: one trajectory, one partition")
    occurred_at: AwareDatetime = Field(description="when it happened, timezone-aware (stored as UTC)")
    producer: Id = Field(min_length=1, description="who wrote the event, e.g. 'sdk/0.1.0' or 'rules'")

    @field_validator("occurred_at")
    @classmethod
    def _to_utc(cls, value: datetime) -> datetime:
        return value.astimezone(UTC)


# --- agent.events -------------------------------------------------------------------------------


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


class StepRecorded(EventBase):
    type: Literal["step.recorded"] = "step.recorded"
    step_index: StepIndex
    thought: Text = ""
    tool: Id = ""
    params: JsonDict = Field(default_factory=dict)
    observation: Text = ""
    exit_code: Int64 | None = None
    error: Text | None = None
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


# --- reward.rule --------------------------------------------------------------------------------


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


# --- reward.judge -------------------------------------------------------------------------------


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


# --- feedback.human -----------------------------------------------------------------------------


class FeedbackAnnotation(EventBase):
    type: Literal["feedback.annotation"] = "feedback.annotation"
    step_index: StepIndex | None = Field(None, description="None: the annotation is for the trajectory")
    rubric: Id = "overall"
    score: Score
    annotator: Id = ""
    comment: Text = ""
    redactions: Count = Field(0, description=REDACTIONS_HELP)


class CalibrationUpdated(EventBase):
    """A fitted monotone map from automatic (judge) scores to human scores, per domain and rubric.

    Published on `feedback.human`; `trajectory_id` carries `calibration:<domain>:<rubric>` (the key).
    The map is piecewise-linear through (`xs`, `ys`), clamped outside; the newest `version` wins.
    """

    type: Literal["calibration.updated"] = "calibration.updated"
    version: str = Field(min_length=1)
    domain: str = "generic"
    rubric: str = "overall"
    xs: list[float] = Field(default_factory=list, description="automatic scores, ascending")
    ys: list[float] = Field(default_factory=list, description="calibrated scores, non-decreasing")
    metrics: dict[str, float] = Field(default_factory=dict, description="pearson, spearman, kendall, ...")
    n: Count = 0


# --- trajectory.scored --------------------------------------------------------------------------


class ScoredStep(BaseModel):
    """One step inside `trajectory.scored`, with each reward layer (None = absent)."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)

    step_index: StepIndex
    thought: Text = ""
    tool: Id = ""
    params: JsonDict = Field(default_factory=dict)
    observation: Text = ""
    exit_code: Int64 | None = None
    error: Text | None = None
    rule_score: Score | None = None
    redundancy: Score | None = None
    regression: Score | None = None
    info_utilization: Score | None = None
    judge_score: Score | None = None
    judge_scores: dict[str, Score] = Field(default_factory=dict)
    human_score: Score | None = None
    process_score: Score | None = Field(None, description="combined step reward over present layers")
    input_tokens: Count | None = None
    output_tokens: Count | None = None
    token_ids: TokenIds | None = None
    logprobs: Logprobs | None = None
    policy_version: str | None = None
    # Token-in/token-out fields of the step as the policy server recorded them (see StepRecorded);
    # what the GRPO builder trains on without re-tokenising. Absent for steps recorded elsewhere.
    prompt_token_ids: TokenIds | None = None
    prompt_delta_start: Count | None = None
    token_continuity: Literal["first", "ok", "broken"] | None = None
    event_id: str | None = Field(None, description="the step.recorded event this step came from")
    layers: list[str] = Field(
        default_factory=list,
        description="reward layers with a signal on this step, of rules / judge / human (since 1.2)",
    )
    missing_layers: dict[str, str] = Field(
        default_factory=dict,
        description="expected layers without a signal -> why, e.g. judge -> 'failed (error): timeout' "
        "(since 1.2)",
    )

    def present_layers(self) -> list[str]:
        """`layers`, or for a step written before 1.2 the layers whose score is present."""
        if self.layers:
            return list(self.layers)
        scores = (("rules", self.rule_score), ("judge", self.judge_score), ("human", self.human_score))
        return [name for name, score in scores if score is not None]


class TrajectoryScored(EventBase):
    type: Literal["trajectory.scored"] = "trajectory.scored"
    task_id: str
    task: str = ""
    domain: str = "generic"
    agent: str = ""
    model: str = ""
    policy_version: str | None = None
    group_id: str | None = None
    success: bool | None = None
    steps: Annotated[list[ScoredStep], Field(max_length=MAX_STEPS)] = Field(default_factory=list)
    total_steps: StepCount = 0
    outcome_score: Score | None = None
    process_score: Score | None = None
    efficiency_score: Score | None = None
    total_reward: Score | None = None
    complete: bool = True
    missing: list[str] = Field(default_factory=list, description="what was absent when emitted")
    revision: Count = 0
    reward_version: str = ""
    reward_definition: str = Field(
        "",
        description="which layers the reward was computed from, with the reward version, e.g. "
        "'rules+judge@assembly-1+rules-1' (see `reward_definition`; since 1.2)",
    )
    calibration_version: str | None = None
    started_at: AwareDatetime | None = None
    ended_at: AwareDatetime | None = None
    metadata: JsonDict = Field(default_factory=dict)

    def definition(self) -> str:
        """`reward_definition`, or for an event written before 1.2 the one its step scores imply."""
        if self.reward_definition:
            return self.reward_definition
        return reward_definition([s.present_layers() for s in self.steps], self.reward_version)


LAYERS = ("rules", "judge", "human")


def reward_definition(step_layers: list[list[str]], reward_version: str) -> str:
    """The id of the reward definition: the layers every step has, then the layers only some steps
    have marked `(partial)`, `none` without any, then `@` and the reward version. Trajectories with
    the same id were scored the same way; the trainer never compares rewards across ids.

    >>> reward_definition([["rules", "judge"], ["rules"]], "assembly-1+rules-1")
    'rules+judge(partial)@assembly-1+rules-1'
    >>> reward_definition([["rules", "judge"]] * 2, "v"), reward_definition([], "v")
    ('rules+judge@v', 'none@v')
    """
    sets = [set(layers) for layers in step_layers]
    every = set.intersection(*sets) if sets else set()
    some = set.union(*sets) - every if sets else set()
    order = [*LAYERS, *sorted((every | some) - set(LAYERS))]
    names = [n for n in order if n in every] + [f"{n}(partial)" for n in order if n in some]
    return f"{'+'.join(names) or 'none'}@{reward_version}"


# --- reward.versions ----------------------------------------------------------------------------


class RewardVersionCompleted(EventBase):
    """A replay under `version` finished (`agentstream replay`): the trajectories it re-scored are
    all published. On `reward.versions`, keyed (and compacted) by version: `trajectory_id` carries
    `reward-version:<version>`. ClickHouse keeps it in `reward_versions`; readers default to the
    newest completed version (docs/reward-versions.md)."""

    type: Literal["reward.version.completed"] = "reward.version.completed"
    version: str = Field(min_length=1, description="the replay's --reward-version, e.g. 'rules-2'")
    roles: list[str] = Field(default_factory=list, description="the roles it replayed, e.g. rules, assembler")
    source_end_offsets: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description="topic -> partition -> end offset (exclusive) of the source records it covered",
    )
    since: AwareDatetime | None = Field(None, description="the replay's --since (None: from the beginning)")
    started_at: AwareDatetime = Field(description="when the replay started")
    completed_at: AwareDatetime = Field(description="when it had processed every source record")
    app_id: str = Field("", description="the replay's app id (its consumer group)")


# --- training.batches / policy.updates ----------------------------------------------------------


class BatchBuilt(EventBase):
    """A training batch file was written. `trajectory_id` carries the batch id (the topic key)."""

    type: Literal["batch.built"] = "batch.built"
    batch_id: str
    kind: Literal["sft", "sft_tokenized", "dpo", "dpo_step", "grpo"]
    path: str
    format: Literal["jsonl", "parquet"] = "jsonl"
    row_count: Count
    trajectory_ids: list[str] = Field(default_factory=list)
    source_offsets: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="topic -> partition -> next offset covered by this batch"
    )
    source_ranges: dict[str, dict[str, list[int]]] = Field(
        default_factory=dict,
        description="topic -> partition -> [first, last] offset of the records this batch was built from",
    )
    reward_versions: list[str] = Field(default_factory=list)
    calibration_versions: list[str] = Field(default_factory=list)
    policy_versions: list[str] = Field(default_factory=list)
    builder_config: JsonDict = Field(default_factory=dict)
    sha256: str = ""


class PolicyUpdated(EventBase):
    """A training step produced a new policy. `trajectory_id` carries the policy version (the key)."""

    type: Literal["policy.updated"] = "policy.updated"
    policy_version: str
    previous_version: str | None = None
    base_model: str = ""
    checkpoint_path: str = ""
    method: str = ""
    step: Count = 0
    batch_ids: list[str] = Field(default_factory=list)
    metrics: dict[str, float] = Field(
        default_factory=dict,
        description="the update's metrics: loss, is_ratio_mean, is_ratio_max, ess, clipped_fraction, "
        "is_truncated_fraction, kl, lr, grad_norm, tokens, dropped_groups, trained_groups",
    )
    # Lineage: what this version was trained on, down to the records (see `agentstream lineage`).
    source_ranges: dict[str, dict[str, list[int]]] = Field(
        default_factory=dict,
        description="topic -> partition -> [first, last] offset of the records its batches were built from",
    )
    trajectory_ids: list[str] = Field(default_factory=list, description="trajectories it trained on")
    behaviour_versions: list[str] = Field(
        default_factory=list, description="policy versions that sampled the data it trained on"
    )
    staleness_histogram: dict[str, int] = Field(
        default_factory=dict, description="versions behind -> GRPO groups admitted at that staleness"
    )
    dropped_groups: Count = Field(0, description="GRPO groups dropped whole as too stale")


# --- agentstream.dlq ----------------------------------------------------------------------------


class DeadLetter(EventBase):
    """Input a stage could not use, with why and where it came from. `trajectory_id` is 'unknown'
    when the input did not carry one."""

    type: Literal["dead.letter"] = "dead.letter"
    reason: Text
    error_type: Id = ""
    stage: str = Field(description="the processor that rejected it (its stable name)")
    source_topic: str | None = None
    source_partition: int | None = None
    source_offset: int | None = None
    source_key: Id | None = None
    payload: Text = Field(
        "",
        description="the rejected bytes, or their first MAX_DEAD_LETTER_PAYLOAD_BYTES when larger (see "
        "payload_truncated): utf-8 text, or base64 (see encoding)",
    )
    payload_encoding: Literal["utf-8", "base64"] = "utf-8"
    payload_bytes: ByteCount | None = Field(None, description="size of the whole rejected input (since 1.3)")
    payload_sha256: str | None = Field(
        None, max_length=64, description="sha256 hex of the whole rejected input (since 1.3)"
    )
    payload_truncated: bool = Field(False, description="`payload` is a prefix of the input (since 1.3)")


Event = Annotated[
    EpisodeStarted
    | StepRecorded
    | EpisodeEnded
    | RuleRewardStep
    | JudgeStep
    | JudgeTrajectory
    | JudgeFailed
    | FeedbackAnnotation
    | CalibrationUpdated
    | TrajectoryScored
    | BatchBuilt
    | PolicyUpdated
    | DeadLetter
    | RewardVersionCompleted,
    Field(discriminator="type"),
]

EVENT_MODELS: dict[str, type[EventBase]] = {
    model.model_fields["type"].default: model
    for model in (
        EpisodeStarted,
        StepRecorded,
        EpisodeEnded,
        RuleRewardStep,
        JudgeStep,
        JudgeTrajectory,
        JudgeFailed,
        FeedbackAnnotation,
        CalibrationUpdated,
        TrajectoryScored,
        BatchBuilt,
        PolicyUpdated,
        DeadLetter,
        RewardVersionCompleted,
    )
}
EVENT_TYPES: tuple[str, ...] = tuple(EVENT_MODELS)

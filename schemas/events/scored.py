"""`trajectory.scored`: a trajectory with every reward layer assembled per step, the id of the
reward definition it was scored under, and `reward.versions`: a replay under a version finished."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AwareDatetime, Field

from schemas.bounded import Count, Id, JsonDict, Logprobs, Score, StepCount, TokenIds
from schemas.events.agent import StepAction
from schemas.events.envelope import PURPOSE_HELP, EventBase, Purpose
from schemas.limits import MAX_STEPS


class ScoredStep(StepAction):
    """One step inside `trajectory.scored`, with each reward layer (None = absent)."""

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
    tokenizer_hash: Id | None = Field(
        None,
        description="the recording server's tokenizer and chat template (see StepRecorded); the GRPO "
        "builder leaves out steps recorded under another tokenizer than the training base's (since 1.4)",
    )
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
    purpose: Purpose = Field("train", description=PURPOSE_HELP)

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

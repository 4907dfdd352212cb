"""The event contract: one frozen pydantic model per event type, and `Event`, their union on `type`.

Parts, one per family of topics: `envelope` (EventBase, the schema version), `agent`
(agent.events), `rewards` (reward.rule, reward.judge), `feedback` (feedback.human), `scored`
(trajectory.scored, reward.versions), `training` (training.batches, policy.updates) and
`dead_letter` (agentstream.dlq). This module is the package's public face: import event models from
`schemas.events`.

Rules (README, "Versioning"):
- Every event carries the envelope: `event_id`, `type`, `schema_version`, `trajectory_id`,
  `occurred_at` (timezone-aware, normalised to UTC) and `producer`. Payload fields sit beside them.
- Models read tolerantly: unknown fields are ignored, and fields added after 1.0 are optional, so an
  older `schema_version` decodes. A newer *major* version is refused by the codec.
- `None` means "absent / no signal", never a neutral value: a reward layer without a signal is None.
- Field names are fixed by ARCHITECTURE.md; add fields freely, never rename.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from schemas.events.agent import EpisodeEnded, EpisodeStarted, StepRecorded
from schemas.events.dead_letter import DeadLetter
from schemas.events.envelope import REDACTIONS_HELP, SCHEMA_MAJOR, SCHEMA_VERSION, EventBase, utc_now
from schemas.events.feedback import CalibrationUpdated, FeedbackAnnotation
from schemas.events.rewards import JudgeFailed, JudgeStep, JudgeTrajectory, RuleRewardStep
from schemas.events.scored import (
    LAYERS,
    RewardVersionCompleted,
    ScoredStep,
    TrajectoryScored,
    reward_definition,
)
from schemas.events.training import BatchBuilt, BatchRows, PolicyUpdated

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
    | BatchRows
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
        BatchRows,
        BatchBuilt,
        PolicyUpdated,
        DeadLetter,
        RewardVersionCompleted,
    )
}
EVENT_TYPES: tuple[str, ...] = tuple(EVENT_MODELS)

__all__ = [
    "EVENT_MODELS",
    "EVENT_TYPES",
    "LAYERS",
    "REDACTIONS_HELP",
    "SCHEMA_MAJOR",
    "SCHEMA_VERSION",
    "BatchBuilt",
    "BatchRows",
    "CalibrationUpdated",
    "DeadLetter",
    "EpisodeEnded",
    "EpisodeStarted",
    "Event",
    "EventBase",
    "FeedbackAnnotation",
    "JudgeFailed",
    "JudgeStep",
    "JudgeTrajectory",
    "PolicyUpdated",
    "RewardVersionCompleted",
    "RuleRewardStep",
    "ScoredStep",
    "StepRecorded",
    "TrajectoryScored",
    "reward_definition",
    "utc_now",
]

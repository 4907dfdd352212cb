"""The contract every part of agentstream speaks: event models, topic registry, codec, ids.

Importing this package is cheap (pydantic + orjson); it has no side effects.
"""

from schemas.codec import decode, encode, encode_key, validate
from schemas.errors import AgentstreamError, DecodeError, FieldError, SchemaError
from schemas.events import (
    EVENT_MODELS,
    EVENT_TYPES,
    SCHEMA_MAJOR,
    SCHEMA_VERSION,
    BatchBuilt,
    DeadLetter,
    EpisodeEnded,
    EpisodeStarted,
    Event,
    EventBase,
    FeedbackAnnotation,
    JudgeFailed,
    JudgeStep,
    JudgeTrajectory,
    PolicyUpdated,
    RuleRewardStep,
    ScoredStep,
    StepRecorded,
    TrajectoryScored,
    utc_now,
)
from schemas.ids import derived_event_id, new_event_id
from schemas.topics import TOPIC_FOR_TYPE, TOPICS, TopicSpec, topic_for

__all__ = [
    "EVENT_MODELS",
    "EVENT_TYPES",
    "SCHEMA_MAJOR",
    "SCHEMA_VERSION",
    "TOPICS",
    "TOPIC_FOR_TYPE",
    "AgentstreamError",
    "BatchBuilt",
    "DeadLetter",
    "DecodeError",
    "EpisodeEnded",
    "EpisodeStarted",
    "Event",
    "EventBase",
    "FeedbackAnnotation",
    "FieldError",
    "JudgeFailed",
    "JudgeStep",
    "JudgeTrajectory",
    "PolicyUpdated",
    "RuleRewardStep",
    "SchemaError",
    "ScoredStep",
    "StepRecorded",
    "TopicSpec",
    "TrajectoryScored",
    "decode",
    "derived_event_id",
    "encode",
    "encode_key",
    "new_event_id",
    "topic_for",
    "utc_now",
    "validate",
]

"""The topic registry: every topic's name, key, default partitions, configs and event types.

No other module spells a topic name as a string literal; import the constants from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

AGENT_EVENTS = "agent.events"
REWARD_RULE = "reward.rule"
REWARD_JUDGE = "reward.judge"
FEEDBACK_HUMAN = "feedback.human"
TRAJECTORY_SCORED = "trajectory.scored"
TRAINING_BATCHES = "training.batches"
POLICY_UPDATES = "policy.updates"
DLQ = "agentstream.dlq"
REWARD_VERSIONS = "reward.versions"

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class TopicSpec:
    name: str
    event_types: tuple[str, ...]
    partitions: int = 4
    key: str = "trajectory_id"
    config: dict[str, str] = field(default_factory=dict)
    description: str = ""


TOPICS: dict[str, TopicSpec] = {
    spec.name: spec
    for spec in (
        TopicSpec(
            AGENT_EVENTS,
            ("episode.started", "step.recorded", "episode.ended"),
            config={"cleanup.policy": "delete", "retention.ms": str(30 * DAY_MS)},
            description="raw agent activity from producers",
        ),
        TopicSpec(
            REWARD_RULE,
            ("reward.rule.step",),
            config={"cleanup.policy": "delete", "retention.ms": str(30 * DAY_MS)},
            description="rule-based process rewards, one per step",
        ),
        TopicSpec(
            REWARD_JUDGE,
            ("reward.judge.step", "reward.judge.trajectory", "reward.judge.failed"),
            config={"cleanup.policy": "delete", "retention.ms": str(30 * DAY_MS)},
            description="LLM-judge scores and failures",
        ),
        TopicSpec(
            FEEDBACK_HUMAN,
            ("feedback.annotation", "calibration.updated"),
            config={"cleanup.policy": "delete", "retention.ms": "-1"},
            description="human labels (kept forever: calibration refits from them)",
        ),
        TopicSpec(
            TRAJECTORY_SCORED,
            ("trajectory.scored",),
            config={"cleanup.policy": "delete", "retention.ms": str(30 * DAY_MS)},
            description="assembled, scored trajectories (one per revision)",
        ),
        TopicSpec(
            TRAINING_BATCHES,
            ("batch.rows", "batch.built"),
            partitions=1,
            key="batch_id",
            config={"cleanup.policy": "delete", "retention.ms": "-1"},
            description="training batches from the trainer consumer: each batch's rows in batch.rows chunks, "
            "then its batch.built (keyed by batch id)",
        ),
        TopicSpec(
            POLICY_UPDATES,
            ("policy.updated",),
            partitions=1,
            key="policy_version",
            config={"cleanup.policy": "delete", "retention.ms": "-1"},
            description="new policy versions from the training executor",
        ),
        TopicSpec(
            DLQ,
            ("dead.letter",),
            partitions=1,
            config={"cleanup.policy": "delete", "retention.ms": str(90 * DAY_MS)},
            description="input any stage could not use, with reason and source coordinates",
        ),
        TopicSpec(
            REWARD_VERSIONS,
            ("reward.version.completed",),
            partitions=1,
            key="version",
            config={"cleanup.policy": "compact"},
            description="completed reward-version replays, one per version (keyed by 'reward-version:<v>')",
        ),
    )
}

TOPIC_FOR_TYPE: dict[str, str] = {t: spec.name for spec in TOPICS.values() for t in spec.event_types}


def topic_for(event_type: str) -> str:
    """The topic an event type is published to."""
    return TOPIC_FOR_TYPE[event_type]

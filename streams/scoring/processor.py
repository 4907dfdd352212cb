"""The scoring role's batch logic: rule rewards and trajectory assembly in one pass over each batch.
No faust, no I/O.

The rule rewards (streams/rules/) and the assembly (streams/assembler/) in one role, the only
topology (the separate `rules` and `assembler` roles of earlier releases are gone): agent events,
judge rewards and human feedback in; `reward.rule.step` and `trajectory.scored` out. Each record is
decoded once; the rule rewards a batch produces are published (same ids, same bytes as the rules
alone would make) and joined into their trajectories in the same batch, so `reward.rule` is written
but never read back. Against two consumer groups that saves fetching `agent.events` twice and
decoding every step and every rule reward a second time; and a trajectory is complete as soon as its
last step arrives, not one more hop later.

The role's stable name `scoring` is its faust app id / consumer group (`agentstream-scoring`), its
dead letters' `stage` and its log lines. Its two tables are the assembler's (`state`, changelog
`agentstream-scoring-state-changelog`) and the rules' (`rules`, `agentstream-scoring-rules-changelog`),
keyed by trajectory id like the sources, so both live in the partition of the trajectory's events.
"""

from __future__ import annotations

from schemas import topics
from schemas.records import Record
from streams.assembler.processor import TrajectoryAssembler
from streams.batch import BatchResult, StateGetter, decode_records
from streams.rules.processor import RuleRewarder

RULES_TABLE = "rules"


class Scoring:
    """agent.events + reward.judge + feedback.human -> reward.rule + trajectory.scored."""

    name = "scoring"
    sources = (topics.AGENT_EVENTS, topics.REWARD_JUDGE, topics.FEEDBACK_HUMAN)
    accepted = {topic: TrajectoryAssembler.accepted[topic] for topic in sources}

    def __init__(self, rules: RuleRewarder, assembler: TrajectoryAssembler):
        if assembler.rule_version not in (None, rules.reward_version):
            raise ValueError(
                f"rule_version: the assembler takes {assembler.rule_version!r} but the rules stamp "
                f"{rules.reward_version!r}"
            )
        self.rules, self.assembler = rules, assembler

    def forget(self) -> None:
        """Drop both decoded-state caches (a batch raised midway: they may hold unstored changes)."""
        self.rules.cache.clear()
        self.assembler.cache.clear()

    def process(self, records: list[Record], get_rules: StateGetter, get_state: StateGetter) -> BatchResult:
        """One batch: every record decoded once; agent events through the rules, then everything
        (with the rule rewards just made, after their trajectory's events) through the assembly."""
        result = BatchResult()
        pairs = list(decode_records(self.name, records, self.accepted, result))
        agent_events = [(rec, event) for rec, event in pairs if rec.topic == topics.AGENT_EVENTS]
        rewards = self.rules.score(agent_events, get_rules, result, table=RULES_TABLE, stage=self.name)
        last_record = {event.trajectory_id: rec for rec, event in agent_events}
        joined = pairs + [(last_record[r.trajectory_id], r) for r in rewards]
        self.assembler.assemble(joined, get_state, result, stage=self.name)
        return result

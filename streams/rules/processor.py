"""Rule rewards' batch logic, the first half of the `scoring` role (streams/scoring/): agent.events
records in, `reward.rule.step` events and state updates out (see streams/rules/stream.py for the
per-trajectory state machine). No faust, no I/O.

In `scoring` its state is the `rules` table (`agentstream-scoring-rules-changelog`); `name` is the
stage of dead letters when it runs alone (pure callers).

State lives in a faust table with a changelog (not rebuilt by replaying the input topics) because a
restart then costs a read of one compacted-size record per open trajectory instead of re-reading
every step ever published; the table is written once per trajectory per batch, not per event.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from clients.kafka.dead_letters import letter_for
from schemas import topics
from schemas.events import EpisodeStarted, RuleRewardStep, StepRecorded
from schemas.records import Record
from streams.batch import (
    STATE,
    BatchResult,
    StateCache,
    StateGetter,
    by_trajectory,
    decode_records,
)
from streams.rules.profiles import ProfileRegistry
from streams.rules.rewards import REWARD_VERSION
from streams.rules.stream import TrajectoryRules


class RuleRewarder:
    """agent.events -> reward.rule: one `reward.rule.step` per step (see streams/rules/stream.py)."""

    name = "rules"
    sources = (topics.AGENT_EVENTS,)
    accepted = {topics.AGENT_EVENTS: {"episode.started", "step.recorded", "episode.ended"}}

    def __init__(
        self, profiles: ProfileRegistry, reward_version: str = REWARD_VERSION, cache_size: int = 100_000
    ):
        self.profiles = profiles
        self.reward_version = reward_version
        # Decoded states of recently seen trajectories, valid while the table holds their bytes (a
        # failed batch exits the process, so the cache never runs ahead of the table).
        self.cache = StateCache(_decode_state, cache_size)

    def process(self, records: list[Record], get_state: StateGetter) -> BatchResult:
        result = BatchResult()
        self.score(decode_records(self.name, records, self.accepted, result), get_state, result)
        return result

    def score(
        self,
        pairs: Iterable[tuple[Record, Any]],
        get_state: StateGetter,
        result: BatchResult,
        table: str = STATE,
        stage: str = "",
    ) -> list[RuleRewardStep]:
        """Fold decoded agent events into their trajectories' states: the rule rewards (new and
        re-emitted) go to `result.outputs` and are returned, the changed states to `result.tables[table]`
        and conflicts to `result.dead` under `stage` (default this role's name)."""
        rewards: list[RuleRewardStep] = []
        for tid, items in by_trajectory(pairs).items():
            key = tid.encode()
            state = self.cache.get(key, get_state)
            changed = self._fold(state, items, rewards)
            advanced = state.advance(tid, self.profiles, self.reward_version)
            rewards += advanced
            changed = changed or bool(advanced)
            for event, reason in state.conflicts:
                rec = next(r for r, e in items if e is event)
                result.dead.append(letter_for(stage or self.name, rec, reason, "ConflictingStep"))
            state.conflicts.clear()
            if changed:
                result.tables.setdefault(table, {})[key] = raw = orjson.dumps(state.to_dict())
                self.cache.stored(key, raw, state)
        result.outputs += rewards
        return rewards

    def _fold(self, state: TrajectoryRules, items, rewards: list[RuleRewardStep]) -> bool:
        changed = False
        for _rec, event in items:
            if isinstance(event, EpisodeStarted):
                changed |= state.domain is None
                state.on_started(event)
            elif isinstance(event, StepRecorded):
                repeat = state.on_step(event, self.reward_version)
                if repeat is not None:
                    rewards.append(repeat)
                else:
                    changed = True
        return changed


def _decode_state(raw: bytes | None) -> TrajectoryRules:
    return TrajectoryRules.from_dict(orjson.loads(raw)) if raw else TrajectoryRules()

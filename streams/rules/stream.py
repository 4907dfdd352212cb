"""Per-trajectory rule-reward state machine for the stream processor: pure, no I/O.

`TrajectoryRules` turns the agent events of one trajectory (in any arrival order) into exactly one
`reward.rule.step` per step, and is a plain dict when stored (`to_dict` / `from_dict`), so the faust
agent keeps one per trajectory in a table.

Ordering: the rules of step i depend on steps 0..i-1 and on the domain from `episode.started`, so a
step is scored only once `episode.started` and every earlier step have arrived; until then it waits
in `pending`. Scores are therefore the same whatever the arrival order (and equal to
`rewards.score_steps` over the steps in index order). A step whose predecessor never arrives keeps
waiting; the assembler reports it as missing after its grace period.

Idempotence: every reward's id is `derived_event_id("reward.rule.step", source_event_id,
reward_version)` and its `occurred_at` is the step's, so its bytes are a function of the input. A step
that arrives again (a producer retry, or a replay after a crash) gets its stored reward re-emitted:
identical id and content, which downstream consumers drop by `event_id`. Re-emitting (instead of
ignoring) covers a crash after the state was saved but before the reward was delivered.

A different step claiming an index that was already scored is a conflict: it is returned in
`conflicts` (the agent sends it to the dead-letter topic) and does not change any reward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from schemas.events import SCHEMA_VERSION, EpisodeStarted, RuleRewardStep, StepRecorded
from schemas.ids import derived_event_id
from streams.rules.profiles import ProfileRegistry
from streams.rules.rewards import REWARD_VERSION, RuleState, StepInput

PRODUCER = "streams/rules"


@dataclass
class TrajectoryRules:
    domain: str | None = None  # None until episode.started arrived
    profile_domain: str = "generic"  # the profile applied (unknown domains map to generic)
    rules: RuleState = field(default_factory=RuleState)
    pending: dict[int, dict[str, Any]] = field(default_factory=dict)  # index -> step fields
    scored: list[list[Any]] = field(default_factory=list)  # per index: [source_id, at, red, reg, info, score]
    conflicts: list[tuple[StepRecorded, str]] = field(default_factory=list)  # not stored

    def on_started(self, event: EpisodeStarted) -> None:
        if self.domain is None:
            self.domain = event.domain or "generic"

    def on_step(self, event: StepRecorded, version: str = REWARD_VERSION) -> RuleRewardStep | None:
        """Register a step. Returns the stored reward when it is a repeat of a scored step."""
        index = event.step_index
        if index < len(self.scored):
            stored = self.scored[index]
            if stored[0] == event.event_id:
                return self._reward(event.trajectory_id, index, stored, version)
            self.conflicts.append((event, f"step_index {index} was already scored from event {stored[0]}"))
            return None
        waiting = self.pending.get(index)
        if waiting is not None and waiting["id"] != event.event_id:
            self.conflicts.append((event, f"step_index {index} is already waiting as event {waiting['id']}"))
            return None
        self.pending[index] = {
            "id": event.event_id,
            "at": event.occurred_at.isoformat(),
            "tool": event.tool,
            "params": event.params,
            "output": event.observation,
        }
        return None

    def advance(self, trajectory_id: str, profiles: ProfileRegistry, version: str = REWARD_VERSION):
        """Score every step that can be scored now (in index order); returns the new rewards."""
        out: list[RuleRewardStep] = []
        if self.domain is None:
            return out
        profile = profiles.get(self.domain)
        self.profile_domain = profile.domain
        while len(self.scored) in self.pending:
            index = len(self.scored)
            step = self.pending.pop(index)
            s = self.rules.score(StepInput(step["tool"], step["params"], step["output"]), profile)
            stored = [step["id"], step["at"], s.redundancy, s.regression, s.info_utilization, s.score]
            self.scored.append(stored)
            out.append(self._reward(trajectory_id, index, stored, version))
        return out

    def _reward(
        self, trajectory_id: str, index: int, stored: list, version: str = REWARD_VERSION
    ) -> RuleRewardStep:
        source_id, at, red, reg, info, score = stored
        # model_construct: every value here was computed or validated already (hot path)
        return RuleRewardStep.model_construct(
            schema_version=SCHEMA_VERSION,
            event_id=derived_event_id("reward.rule.step", source_id, version),
            trajectory_id=trajectory_id,
            occurred_at=datetime.fromisoformat(at),
            producer=PRODUCER,
            step_index=index,
            redundancy=red,
            regression=reg,
            info_utilization=info,
            score=score,
            domain=self.profile_domain,
            reward_version=version,
            source_event_id=source_id,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "profile_domain": self.profile_domain,
            "rules": self.rules.to_dict(),
            "pending": {str(k): v for k, v in self.pending.items()},
            "scored": self.scored,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrajectoryRules:
        return cls(
            domain=data["domain"],
            profile_domain=data.get("profile_domain", "generic"),
            rules=RuleState.from_dict(data["rules"]),
            pending={int(k): v for k, v in data["pending"].items()},
            scored=[list(s) for s in data["scored"]],
        )

"""Trajectory assembly: a pure state machine per trajectory.

Joins `episode.started`, `step.recorded`, `episode.ended`, `reward.rule.step`, judge events
(`reward.judge.step`, `reward.judge.trajectory`, `reward.judge.failed`) and human
`feedback.annotation`s of one trajectory, in any arrival order, into `trajectory.scored`. No I/O:
the assembler's batch logic (streams/assembler/processor.py) feeds events in and sends what
`decide` returns.

When it emits (`Assembly.decide(now, grace_s)`):
- at once, when nothing is left to wait for: the episode started and ended, every step 0..N-1
  arrived (N = `episode.ended.total_steps`, else the highest index seen + 1), every step has its
  rule reward, and, when the judge is expected for this trajectory, every judge target (each step in
  step mode, else the trajectory) is settled: scored, or failed for good. A `budget_paused` failure
  with a later `retry_at` is pending, not settled (streams/assembler/layers.py).
- otherwise, after `grace_s` seconds without new input (the configured wait), with what it has.
  `complete` is then True when only judge results were missing (they are given up, and each step
  says so in `missing_layers`), False when structure or rule rewards were missing.
- after an emission, input that changes the content gives a new `revision` (+1): immediately when
  nothing is left to wait for, else after the grace period again (a judge score that arrives after
  the wait, or replaces a failure, gives a new revision). Input that does not change it emits nothing.
Duplicates (same `event_id`) are ignored; a second event for the same step slot with another id is
ignored too and reported in `ignored` (a newer judge failure replaces an older one; a score stands).

`missing` names what the emission lacks (e.g. `episode.ended`, `reward.rule.step[3]`,
`reward.judge.step[2]`, failed judge targets included; past `slots.MAX_LISTED_SLOTS` absent slots of a kind,
a run of them is one entry such as `step.recorded[7..99999]`, so the list and the work to make it are
bounded by what arrived, never by a claimed `step_index` or `total_steps`); each step's `layers`
and `missing_layers` say which layers it has and why an expected one is absent; `reward_definition`
names the layers every step has and the reward version (`schemas.events.reward_definition`).

Ids: `derived_event_id("trajectory.scored", trajectory_id, revision, content_hash)`, and `occurred_at`
is the latest `occurred_at` of the joined input, so a replay of the same input recreates the same
ids and bytes. Which input an *incomplete* (grace) emission saw depends on timing, so only emissions
made with nothing left to wait for are guaranteed to be reproduced by a replay. The content holds
`reward_version` (`assembly-1+<rule version>`), so an assembly under another rule version (a replay)
has other ids.

The content itself (scores, layers, `missing`) is built by streams/assembler/scored.py from the
assembly's `joined()` value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.events import (
    EpisodeEnded,
    EpisodeStarted,
    EventBase,
    FeedbackAnnotation,
    JudgeFailed,
    JudgeStep,
    JudgeTrajectory,
    RuleRewardStep,
    StepRecorded,
    TrajectoryScored,
)
from schemas.ids import derived_event_id
from streams.assembler import layers as L
from streams.assembler.reward_math import Calibrations, content_hash
from streams.assembler.scored import JoinedTrajectory, score_trajectory
from streams.assembler.slots import absent_slots
from streams.rules.profiles import ProfileRegistry

STEP_FIELDS = (
    "thought",
    "tool",
    "params",
    "observation",
    "exit_code",
    "error",
    "input_tokens",
    "output_tokens",
    "token_ids",
    "logprobs",
    "policy_version",
    "prompt_token_ids",
    "prompt_delta_start",
    "token_continuity",
    "tokenizer_hash",
)
STARTED_FIELDS = (
    "task_id",
    "task",
    "domain",
    "agent",
    "model",
    "policy_version",
    "group_id",
    "reference_steps",
    "purpose",  # since 1.5: batch builders train on "train" episodes only
)


@dataclass
class Assembly:
    """Everything known about one trajectory. Plain data (`to_dict` / `from_dict`) for the table."""

    seen: set[str] = field(default_factory=set)
    started: dict[str, Any] | None = None
    ended: dict[str, Any] | None = None
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    rules: dict[int, dict[str, Any]] = field(default_factory=dict)
    judge_steps: dict[int, dict[str, Any]] = field(default_factory=dict)  # index -> {score, scores} | failed
    judge_trajectory: dict[str, Any] | None = None
    human: dict[str, dict[str, Any]] = field(default_factory=dict)  # event_id -> {step, rubric, score}
    judge_mode: str | None = None
    latest_at: str = ""
    last_change: float = 0.0  # wall clock of the last change (seconds), for the grace period
    revision: int = -1  # last emitted revision (-1: none yet)
    emitted_hash: str = ""
    ignored: list[str] = field(default_factory=list)  # not stored: slots already taken, for logging

    # --- input ---------------------------------------------------------------------------------

    def add(self, event: EventBase, now: float, judge_mode: str | None = None) -> bool:
        """Fold one event in. Returns False for a duplicate or an ignored event."""
        if event.event_id in self.seen:
            return False
        handler = _HANDLERS.get(type(event))
        if handler is None or not handler(self, event, judge_mode):
            self.ignored.append(f"{event.type} {event.event_id}: slot already filled or not joinable")
            return False
        self.seen.add(event.event_id)
        at = event.occurred_at.isoformat()
        self.latest_at = max(self.latest_at, at)
        self.last_change = now
        return True

    def _started(self, e: EpisodeStarted, judge_mode: str | None) -> bool:
        if self.started is not None:
            return False
        self.started = {k: getattr(e, k) for k in STARTED_FIELDS}
        self.started["metadata"] = e.metadata
        self.started["at"] = e.occurred_at.isoformat()
        self.judge_mode = judge_mode
        return True

    def _step(self, e: StepRecorded, _mode) -> bool:
        if e.step_index in self.steps:
            return False
        self.steps[e.step_index] = {k: getattr(e, k) for k in STEP_FIELDS} | {"event_id": e.event_id}
        return True

    def _ended(self, e: EpisodeEnded, _mode) -> bool:
        # The longest end wins: steps that arrived after an episode ended (OTLP spans after their
        # root) end it again with a larger total_steps; an equal or shorter one adds nothing.
        if self.ended is not None and (e.total_steps or 0) <= (self.ended["total_steps"] or 0):
            return False
        self.ended = {
            "success": e.success,
            "score": e.score,
            "tests_passed": e.tests_passed,
            "tests_failed": e.tests_failed,
            "total_steps": e.total_steps,
            "at": e.occurred_at.isoformat(),
        }
        return True

    def _rule(self, e: RuleRewardStep, _mode) -> bool:
        if e.step_index in self.rules:
            return False
        self.rules[e.step_index] = {
            "redundancy": e.redundancy,
            "regression": e.regression,
            "info_utilization": e.info_utilization,
            "score": e.score,
            "version": e.reward_version,
        }
        return True

    def _judge_step(self, e: JudgeStep, _mode) -> bool:
        if "score" in self.judge_steps.get(e.step_index, {}):
            return False
        self.judge_steps[e.step_index] = {"score": e.score, "scores": dict(e.scores)}
        return True

    def _judge_trajectory(self, e: JudgeTrajectory, _mode) -> bool:
        if self.judge_trajectory is not None and "score" in self.judge_trajectory:
            return False
        self.judge_trajectory = {"score": e.score, "scores": dict(e.scores)}
        return True

    def _judge_failed(self, e: JudgeFailed, _mode) -> bool:
        """Kept until a score replaces it; the newest failure of a target stands (layers.py)."""
        current = self.judge_trajectory if e.step_index is None else self.judge_steps.get(e.step_index)
        kept = L.fold_failure(current, L.failure_entry(e))
        if kept is None:
            return False  # the target has a score: a failure does not undo it
        if e.step_index is None:
            self.judge_trajectory = kept
        else:
            self.judge_steps[e.step_index] = kept
        return True

    def _human(self, e: FeedbackAnnotation, _mode) -> bool:
        self.human[e.event_id] = {"step": e.step_index, "rubric": e.rubric, "score": e.score}
        return True

    # --- completeness and emission ---------------------------------------------------------------

    def expected_steps(self) -> int:
        if self.ended is not None and self.ended["total_steps"] is not None:
            return self.ended["total_steps"]
        return max(self.steps, default=-1) + 1

    def _gaps(self, judge_done) -> list[str]:
        """The parts still absent, counting a judge target as there when `judge_done(entry)`."""
        out = [
            name
            for name, part in (("episode.started", self.started), ("episode.ended", self.ended))
            if not part
        ]
        n = self.expected_steps()
        out += absent_slots("step.recorded", n, self.steps)
        out += absent_slots("reward.rule.step", n, self.rules)
        if self.judge_mode == "step" and not judge_done(None):
            done = [i for i, entry in self.judge_steps.items() if judge_done(entry)]
            out += absent_slots("reward.judge.step", n, done)
        elif self.judge_mode is not None and not judge_done(self.judge_trajectory):
            out.append("reward.judge.trajectory")
        return out

    def missing(self) -> list[str]:
        """What the assembler still waits for (empty: emit now). Failed judge targets are settled;
        pending (budget-paused) and not yet arrived ones are waited for."""
        return self._gaps(L.settled)

    def absent(self) -> list[str]:
        """What an emission lacks: `missing()` plus the judge targets that failed for good."""
        return self._gaps(L.scored)

    def structure_missing(self) -> list[str]:
        """Absent parts that no wait can give up: the episode, its steps, their rule rewards."""
        return self._gaps(lambda _entry: True)

    def joined(self) -> JoinedTrajectory:
        """What scoring reads (streams/assembler/scored.py): the joined parts and their completeness."""
        return JoinedTrajectory(
            started=self.started,
            ended=self.ended,
            steps=self.steps,
            rules=self.rules,
            judge_steps=self.judge_steps,
            judge_trajectory=self.judge_trajectory,
            human=self.human,
            judge_mode=self.judge_mode,
            latest_at=self.latest_at,
            expected_steps=self.expected_steps(),
            complete=not self.structure_missing(),
            missing=self.absent(),
        )

    def decide(
        self,
        trajectory_id: str,
        profiles: ProfileRegistry,
        calibrations: Calibrations,
        now: float,
        grace_s: float,
        clock_floor: float = 0.0,
        rule_version: str | None = None,
    ) -> TrajectoryScored | None:
        """The `trajectory.scored` to emit now, if any (and records it as emitted).

        `clock_floor`: the grace period never counts from before this time (a restarted worker
        passes its start time, so trajectories restored from the table get a full grace period).
        `rule_version`: the rule version this assembly is for (`score_trajectory`)."""
        quiet = now - max(self.last_change, clock_floor) >= grace_s
        if self.missing() and not quiet:
            return None
        content = score_trajectory(
            self.joined(), trajectory_id, profiles, calibrations, wait_s=grace_s, rule_version=rule_version
        )
        digest = content_hash(content)
        if digest == self.emitted_hash:
            return None
        self.revision += 1
        self.emitted_hash = digest
        event_id = derived_event_id("trajectory.scored", trajectory_id, self.revision, digest)
        return content.model_copy(update={"event_id": event_id, "revision": self.revision})

    # --- storage ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "seen": sorted(self.seen),
            "started": self.started,
            "ended": self.ended,
            "steps": _str_keys(self.steps),
            "rules": _str_keys(self.rules),
            "judge_steps": _str_keys(self.judge_steps),
            "judge_trajectory": self.judge_trajectory,
            "human": self.human,
            "judge_mode": self.judge_mode,
            "latest_at": self.latest_at,
            "last_change": self.last_change,
            "revision": self.revision,
            "emitted_hash": self.emitted_hash,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Assembly:
        return cls(
            seen=set(d["seen"]),
            started=d["started"],
            ended=d["ended"],
            steps=_int_keys(d["steps"]),
            rules=_int_keys(d["rules"]),
            judge_steps=_int_keys(d["judge_steps"]),
            judge_trajectory=d["judge_trajectory"],
            human=d["human"],
            judge_mode=d["judge_mode"],
            latest_at=d["latest_at"],
            last_change=d["last_change"],
            revision=d["revision"],
            emitted_hash=d["emitted_hash"],
        )


_HANDLERS = {
    EpisodeStarted: Assembly._started,
    StepRecorded: Assembly._step,
    EpisodeEnded: Assembly._ended,
    RuleRewardStep: Assembly._rule,
    JudgeStep: Assembly._judge_step,
    JudgeTrajectory: Assembly._judge_trajectory,
    JudgeFailed: Assembly._judge_failed,
    FeedbackAnnotation: Assembly._human,
}
JOINED_TYPES = tuple(model.model_fields["type"].default for model in _HANDLERS)


def _str_keys(d: dict[int, Any]) -> dict[str, Any]:
    return {str(k): v for k, v in d.items()}


def _int_keys(d: dict[str, Any]) -> dict[int, Any]:
    return {int(k): v for k, v in d.items()}

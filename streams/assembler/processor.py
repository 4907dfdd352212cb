"""Trajectory assembly's batch logic, the second half of the `scoring` role (streams/scoring/):
agent events, rule and judge rewards and human feedback in, `trajectory.scored` out (see
streams/assembler/assembly.py for the per-trajectory state machine). No faust, no I/O; the
grace-period timer calls `expire`.

In `scoring` its state is the `state` table; `name` is its log lines' prefix and the stage of dead
letters when it runs alone (pure callers). Calibration maps (`calibration.updated` on
feedback.human) are kept in the same table under `calibration:<domain>:<rubric>` keys, so a
restarted worker keeps applying them.

One assembler assembles under one rule version (`rule_version`, the worker's `--reward-version`):
`reward.rule.step` events of other versions are dropped before they reach a trajectory (not a
conflict, not a change): `scoring` joins only the rewards its rules half stamps, and a reward of
another version handed to it (a pure caller) never alters a trajectory. `None` (pure callers)
takes the first rule reward of a step, whatever its version.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from clients.kafka.dead_letters import letter_for
from schemas import topics
from schemas.events import EpisodeStarted, RuleRewardStep
from schemas.records import Record
from streams.assembler.assembly import JOINED_TYPES, Assembly
from streams.assembler.reward_math import Calibrations
from streams.batch import (
    BatchResult,
    StateCache,
    StateGetter,
    by_trajectory,
    decode_records,
    is_retryable,
)
from streams.rules.profiles import ProfileRegistry

log = logging.getLogger(__name__)

CALIBRATION_TYPE = "calibration.updated"
CALIBRATION_KEY_PREFIX = b"calibration:"


class TrajectoryAssembler:
    """agent.events + reward.rule + reward.judge + feedback.human -> trajectory.scored."""

    name = "assembler"
    sources = (topics.AGENT_EVENTS, topics.REWARD_RULE, topics.REWARD_JUDGE, topics.FEEDBACK_HUMAN)
    accepted = {
        topics.AGENT_EVENTS: {"episode.started", "step.recorded", "episode.ended"},
        topics.REWARD_RULE: {"reward.rule.step"},
        topics.REWARD_JUDGE: {"reward.judge.step", "reward.judge.trajectory", "reward.judge.failed"},
        topics.FEEDBACK_HUMAN: {"feedback.annotation", CALIBRATION_TYPE},
    }

    def __init__(
        self,
        profiles: ProfileRegistry,
        grace_s: float,
        judge_mode: Callable[[EpisodeStarted], str | None] = lambda started: None,
        calibrations: Calibrations | None = None,
        clock: Callable[[], float] = time.time,
        rule_version: str | None = None,
    ):
        self.profiles = profiles
        self.rule_version = rule_version
        self.grace_s = grace_s
        self.judge_mode = judge_mode
        self.calibrations = calibrations or Calibrations()
        self.clock = clock
        self.started_at = clock()
        self.open: dict[bytes, float] = {}  # trajectories that may still emit -> last change
        self.cache = StateCache(self._load)  # decoded states, valid while the table holds their bytes
        self.calibration_at: dict[tuple[str, str], str] = {}

    def process(self, records: list[Record], get_state: StateGetter) -> BatchResult:
        result = BatchResult()
        self.assemble(decode_records(self.name, records, self.accepted, result), get_state, result)
        return result

    def assemble(
        self,
        pairs: Iterable[tuple[Record, Any]],
        get_state: StateGetter,
        result: BatchResult,
        stage: str = "",
    ) -> None:
        """Join decoded events into their trajectories' assemblies: `trajectory.scored` to
        `result.outputs`, the changed states to the `state` table, dead letters under `stage`."""
        now = self.clock()
        joinable, other_versions = [], 0
        for rec, event in pairs:
            if event.type == CALIBRATION_TYPE:
                self._calibration(rec, event, result, stage or self.name)
            elif self._other_version(event):
                other_versions += 1
            else:
                joinable.append((rec, event))
        if other_versions:
            log.debug("%s: %d rule rewards of other versions skipped", self.name, other_versions)
        assert set(JOINED_TYPES) >= {e.type for _, e in joinable}
        for tid, items in by_trajectory(joinable).items():
            key = tid.encode()
            state = self.cache.get(key, get_state)
            changed = False
            for _rec, event in items:
                mode = self.judge_mode(event) if isinstance(event, EpisodeStarted) else None
                changed |= state.add(event, now, judge_mode=mode)
            for note in state.ignored:
                log.info("%s: trajectory %s: ignored %s", self.name, tid, note)
            state.ignored.clear()
            if changed:
                self._emit(tid, state, now, result)
                result.updates[key] = raw = orjson.dumps(state.to_dict())
                self.cache.stored(key, raw, state)

    def _other_version(self, event: Any) -> bool:
        """A rule reward of a version this assembler does not assemble under."""
        return (
            self.rule_version is not None
            and isinstance(event, RuleRewardStep)
            and event.reward_version != self.rule_version
        )

    def _load(self, raw: bytes | None) -> Assembly:
        return Assembly.from_dict(orjson.loads(raw)) if raw else Assembly()

    def _emit(self, tid: str, state: Assembly, now: float, result: BatchResult) -> None:
        scored = state.decide(
            tid, self.profiles, self.calibrations, now, self.grace_s, self.started_at, self.rule_version
        )
        if scored is not None:
            result.outputs.append(scored)
        key = tid.encode()
        if state.missing():
            self.open[key] = state.last_change
        else:
            self.open.pop(key, None)

    def expire(self, get_state: StateGetter) -> BatchResult:
        """Emit what the grace period allows now (called by a timer)."""
        result = BatchResult()
        now = self.clock()
        floor = max(self.started_at, 0.0)
        due = [k for k, last in self.open.items() if now - max(last, floor) >= self.grace_s]
        for key in due:
            try:
                self._expire_one(key, get_state, now, floor, result)
            except Exception as exc:  # a state no input can fix must not stop the timer for good
                if is_retryable(exc):
                    raise
                self.open.pop(key, None)
                self.cache.clear()
                log.error("%s: trajectory %s cannot be emitted (%r); left unemitted", self.name, key, exc)
        return result

    def _expire_one(self, key: bytes, get_state: StateGetter, now: float, floor: float, result) -> None:
        if not get_state(key):
            self.open.pop(key, None)
            return
        state = self.cache.get(key, get_state)
        scored = state.decide(
            key.decode(), self.profiles, self.calibrations, now, self.grace_s, floor, self.rule_version
        )
        self.open.pop(key, None)
        if scored is not None:
            result.outputs.append(scored)
            result.updates[key] = raw = orjson.dumps(state.to_dict())
            self.cache.stored(key, raw, state)

    def track_restored(self, items) -> int:
        """After recovery: reload calibration maps and remember the trajectories that may still emit."""
        count = 0
        for key, raw in items:
            if key.startswith(CALIBRATION_KEY_PREFIX):
                self._restore_calibration(raw)
                continue
            state = self._load(raw)
            if state.missing():
                self.open[key] = state.last_change
                count += 1
        return count

    def _calibration(self, rec: Record, event: Any, result: BatchResult, stage: str) -> None:
        """Newest map per (domain, rubric) by `occurred_at`; stored in the table (key = the event's
        `calibration:<domain>:<rubric>` trajectory id) so a restarted worker keeps applying it."""
        try:
            from streams.judge.calibration import CalibrationMap

            cmap = CalibrationMap.from_event(event)
        except Exception as exc:  # a bad map is poison input, not a crash
            result.dead.append(letter_for(stage, rec, f"calibration map unusable: {exc}", type(exc).__name__))
            return
        at = event.occurred_at.isoformat()
        if at < self.calibration_at.get((cmap.domain, cmap.rubric), ""):
            return  # an older map arriving late (replay): keep the newer one
        self.calibration_at[(cmap.domain, cmap.rubric)] = at
        self.calibrations.update(cmap.domain, cmap.rubric, cmap)
        key = CALIBRATION_KEY_PREFIX + f"{cmap.domain}:{cmap.rubric}".encode()
        result.updates[key] = orjson.dumps({"at": at, "map": cmap.model_dump(mode="json")})
        log.info("%s: calibration %s for (%s, %s)", self.name, cmap.version, cmap.domain, cmap.rubric)

    def _restore_calibration(self, raw: bytes) -> None:
        from streams.judge.calibration import CalibrationMap

        stored = orjson.loads(raw)
        cmap = CalibrationMap.model_validate(stored["map"])
        self.calibration_at[(cmap.domain, cmap.rubric)] = stored["at"]
        self.calibrations.update(cmap.domain, cmap.rubric, cmap)

"""The two stream processors' batch logic, without faust: records in, events + state updates out.

Each processor has one stable name (`RuleRewarder.name == "rules"`, `TrajectoryAssembler.name ==
"assembler"`), used for its faust app id / consumer group (`agentstream-<name>`), its table
(`agentstream-<name>-state-changelog`), its log lines and its dead letters' `stage`.

A batch is processed as: decode every record (bad bytes, invalid schema or an unknown type become
dead letters), group the events by trajectory, load each trajectory's state once, fold its events in,
produce the outputs, and store the state once. The faust shell (streams/agents.py) sends the outputs,
waits until they are acknowledged, then writes the returned state updates to the table, so the
table's changelog never runs ahead of the outputs, and the offsets (committed by faust after the
batch, once its producer is flushed) never run ahead of the table.

State lives in a faust table with a changelog (not rebuilt by replaying the input topics) because a
restart then costs a read of one compacted-size record per open trajectory instead of re-reading
every step ever published; the table is written once per trajectory per batch, not per event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from schemas import topics
from schemas.codec import decode
from schemas.deadletter import dead_letter
from schemas.errors import DecodeError
from schemas.events import DeadLetter, EpisodeStarted, EventBase, StepRecorded
from streams.assembler import JOINED_TYPES, Assembly, Calibrations
from streams.rules.profiles import ProfileRegistry
from streams.rules.rewards import REWARD_VERSION
from streams.rules.stream import TrajectoryRules

log = logging.getLogger(__name__)

CALIBRATION_TYPE = "calibration.updated"
CALIBRATION_KEY_PREFIX = b"calibration:"


@dataclass(frozen=True)
class Record:
    """One consumed Kafka record (raw bytes, with its coordinates for dead letters)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass
class BatchResult:
    outputs: list[EventBase] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    updates: dict[bytes, bytes] = field(default_factory=dict)  # table key -> new state


StateGetter = Callable[[bytes], bytes | None]


def decode_records(stage: str, records: list[Record], accepted: Mapping[str, set[str]], result: BatchResult):
    """Decode records; those that cannot be used become dead letters. Yields (record, event)."""
    for rec in records:
        try:
            event = decode(rec.value if rec.value is not None else b"")
        except DecodeError as exc:
            result.dead.append(_dead(stage, rec, str(exc), "DecodeError"))
            continue
        if event.type not in accepted.get(rec.topic, set()):
            reason = f"type: {event.type!r} is not expected on topic {rec.topic!r} by {stage}"
            result.dead.append(_dead(stage, rec, reason, "UnexpectedType"))
            continue
        yield rec, event


def _dead(stage: str, rec: Record, reason: str, error_type: str) -> DeadLetter:
    log.warning("%s: dead letter from %s[%d]@%d: %s", stage, rec.topic, rec.partition, rec.offset, reason)
    return dead_letter(
        stage,
        reason,
        rec.value,
        topic=rec.topic,
        partition=rec.partition,
        offset=rec.offset,
        key=rec.key,
        error_type=error_type,
    )


def _group(pairs) -> dict[str, list[tuple[Record, Any]]]:
    groups: dict[str, list[tuple[Record, Any]]] = {}
    for rec, event in pairs:
        groups.setdefault(event.trajectory_id, []).append((rec, event))
    return groups


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
        # Decoded states of recently seen trajectories: the table holds the same as bytes. The shell
        # clears it when a batch fails, so it never runs ahead of the table.
        self.cache: dict[bytes, TrajectoryRules] = {}
        self.cache_size = cache_size

    def _state(self, key: bytes, get_state: StateGetter) -> TrajectoryRules:
        state = self.cache.pop(key, None)
        if state is None:
            raw = get_state(key)
            state = TrajectoryRules.from_dict(orjson.loads(raw)) if raw else TrajectoryRules()
        self.cache[key] = state  # re-inserted: the dict's order is least recently used first
        if len(self.cache) > self.cache_size:
            del self.cache[next(iter(self.cache))]
        return state

    def process(self, records: list[Record], get_state: StateGetter) -> BatchResult:
        result = BatchResult()
        for tid, items in _group(decode_records(self.name, records, self.accepted, result)).items():
            key = tid.encode()
            state = self._state(key, get_state)
            changed = self._fold(state, items, result)
            result.outputs += state.advance(tid, self.profiles, self.reward_version)
            changed = changed or bool(result.outputs)
            for event, reason in state.conflicts:
                rec = next(r for r, e in items if e is event)
                result.dead.append(_dead(self.name, rec, reason, "ConflictingStep"))
            state.conflicts.clear()
            if changed:
                result.updates[key] = orjson.dumps(state.to_dict())
        return result

    def _fold(self, state: TrajectoryRules, items, result: BatchResult) -> bool:
        changed = False
        for _rec, event in items:
            if isinstance(event, EpisodeStarted):
                changed |= state.domain is None
                state.on_started(event)
            elif isinstance(event, StepRecorded):
                repeat = state.on_step(event, self.reward_version)
                if repeat is not None:
                    result.outputs.append(repeat)
                else:
                    changed = True
        return changed


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
    ):
        self.profiles = profiles
        self.grace_s = grace_s
        self.judge_mode = judge_mode
        self.calibrations = calibrations or Calibrations()
        self.clock = clock
        self.started_at = clock()
        self.open: dict[bytes, float] = {}  # trajectories that may still emit -> last change
        self.calibration_at: dict[tuple[str, str], str] = {}

    def process(self, records: list[Record], get_state: StateGetter) -> BatchResult:
        result = BatchResult()
        now = self.clock()
        pairs = list(decode_records(self.name, records, self.accepted, result))
        joinable = []
        for rec, event in pairs:
            if event.type == CALIBRATION_TYPE:
                self._calibration(rec, event, result)
            else:
                joinable.append((rec, event))
        assert set(JOINED_TYPES) >= {e.type for _, e in joinable}
        for tid, items in _group(joinable).items():
            key = tid.encode()
            state = self._load(get_state(key))
            changed = False
            for _rec, event in items:
                mode = self.judge_mode(event) if isinstance(event, EpisodeStarted) else None
                changed |= state.add(event, now, judge_mode=mode)
            for note in state.ignored:
                log.info("%s: trajectory %s: ignored %s", self.name, tid, note)
            state.ignored.clear()
            if changed:
                self._emit(tid, state, now, result)
                result.updates[key] = orjson.dumps(state.to_dict())
        return result

    def _load(self, raw: bytes | None) -> Assembly:
        return Assembly.from_dict(orjson.loads(raw)) if raw else Assembly()

    def _emit(self, tid: str, state: Assembly, now: float, result: BatchResult) -> None:
        scored = state.decide(tid, self.profiles, self.calibrations, now, self.grace_s, self.started_at)
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
            raw = get_state(key)
            if not raw:
                self.open.pop(key, None)
                continue
            state = self._load(raw)
            scored = state.decide(key.decode(), self.profiles, self.calibrations, now, self.grace_s, floor)
            self.open.pop(key, None)
            if scored is not None:
                result.outputs.append(scored)
                result.updates[key] = orjson.dumps(state.to_dict())
        return result

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

    def _calibration(self, rec: Record, event: Any, result: BatchResult) -> None:
        """Newest map per (domain, rubric) by `occurred_at`; stored in the table (key = the event's
        `calibration:<domain>:<rubric>` trajectory id) so a restarted worker keeps applying it."""
        try:
            from streams.judge.calibration import CalibrationMap

            cmap = CalibrationMap.from_event(event)
        except Exception as exc:  # a bad map is poison input, not a crash
            result.dead.append(_dead(self.name, rec, f"calibration map unusable: {exc}", type(exc).__name__))
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

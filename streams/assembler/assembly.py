"""Trajectory assembly: a pure state machine per trajectory, and the trajectory totals.

Joins `episode.started`, `step.recorded`, `episode.ended`, `reward.rule.step`, judge events
(`reward.judge.step`, `reward.judge.trajectory`, `reward.judge.failed`) and human
`feedback.annotation`s of one trajectory, in any arrival order, into `trajectory.scored`. No I/O:
the assembler's batch logic (streams/assembler/processor.py) feeds events in and sends what
`decide` returns.

When it emits (`Assembly.decide(now, grace_s)`):
- complete: the episode started and ended, every step 0..N-1 arrived (N = `episode.ended.total_steps`,
  else the highest index seen + 1), every step has its rule reward, and, when the judge is expected
  for this trajectory, every step has a judge score or failure (step mode) or the trajectory has one
  (trajectory / group mode). Then it emits at once.
- otherwise, after `grace_s` seconds without new input, with `complete=False` and `missing` naming
  what was absent (e.g. `episode.ended`, `reward.rule.step[3]`).
- after an emission, input that changes the content gives a new `revision` (+1): immediately when
  complete, else after the grace period again. Input that does not change it emits nothing.
Duplicates (same `event_id`) are ignored; a second event for the same step slot with another id is
ignored too and reported in `ignored`.

Ids: `derived_event_id("trajectory.scored", trajectory_id, revision, content_hash)`, and `occurred_at`
is the latest `occurred_at` of the joined input, so a replay of the same input recreates the same
ids and bytes. Which input an *incomplete* (grace) emission saw depends on timing, so only complete
emissions are guaranteed to be reproduced by a replay.

Scores (`score_trajectory`):
- step process score = weighted mean of the layers present: rule (`reward.rule.step.score`), judge
  (the step's judge score, else the trajectory-level judge score), human (mean of the step's
  annotations, else of the trajectory-level ones), with the domain's layer weights
  (`DomainProfile.layers()`); None when no layer has a signal. Judge scores are calibrated first when
  a calibration map exists for (domain, rubric) (`Calibrations`).
- process = mean of the step process scores present; outcome from `episode.ended` with the domain's
  outcome spec; efficiency from `episode.started.reference_steps`.
- total = weighted outcome / process / efficiency (domain weights, default 0.4 / 0.5 / 0.1),
  renormalised over the components that are not None.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import orjson

from schemas.events import (
    EpisodeEnded,
    EpisodeStarted,
    EventBase,
    FeedbackAnnotation,
    JudgeFailed,
    JudgeStep,
    JudgeTrajectory,
    RuleRewardStep,
    ScoredStep,
    StepRecorded,
    TrajectoryScored,
)
from schemas.ids import derived_event_id
from streams.rules.profiles import DomainProfile, ProfileRegistry
from streams.rules.rewards import efficiency, outcome_score

ASSEMBLY_VERSION = "assembly-1"
PRODUCER = "streams/assembler"
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
)


class CalibrationMap(Protocol):
    version: str

    def apply(self, score: float) -> float: ...


@dataclass
class Calibrations:
    """The newest calibration map per (domain, rubric). Empty means identity (no calibration)."""

    maps: dict[tuple[str, str], CalibrationMap] = field(default_factory=dict)

    def update(self, domain: str, rubric: str, mapping: CalibrationMap) -> None:
        self.maps[(domain, rubric)] = mapping

    def apply(self, domain: str, rubric: str, score: float | None) -> tuple[float | None, str | None]:
        """Calibrated score and the version of the map used (None: no map, score unchanged)."""
        mapping = self.maps.get((domain, rubric))
        if mapping is None or score is None:
            return score, None
        return _clamp(mapping.apply(score)), mapping.version


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
        if self.ended is not None:
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
        if e.step_index is None:
            if self.judge_trajectory is None:
                self.judge_trajectory = {"failed": e.reason}
            return True
        self.judge_steps.setdefault(e.step_index, {"failed": e.reason})
        return True

    def _human(self, e: FeedbackAnnotation, _mode) -> bool:
        self.human[e.event_id] = {"step": e.step_index, "rubric": e.rubric, "score": e.score}
        return True

    # --- completeness and emission ---------------------------------------------------------------

    def expected_steps(self) -> int:
        if self.ended is not None and self.ended["total_steps"] is not None:
            return self.ended["total_steps"]
        return max(self.steps, default=-1) + 1

    def missing(self) -> list[str]:
        """What a complete trajectory would still need (empty: complete)."""
        out = [
            name
            for name, part in (("episode.started", self.started), ("episode.ended", self.ended))
            if not part
        ]
        n = self.expected_steps()
        out += [f"step.recorded[{i}]" for i in range(n) if i not in self.steps]
        out += [f"reward.rule.step[{i}]" for i in range(n) if i not in self.rules]
        if self.judge_mode == "step":
            out += [f"reward.judge.step[{i}]" for i in range(n) if i not in self.judge_steps]
        elif self.judge_mode is not None and self.judge_trajectory is None:
            out.append("reward.judge.trajectory")
        return out

    def decide(
        self,
        trajectory_id: str,
        profiles: ProfileRegistry,
        calibrations: Calibrations,
        now: float,
        grace_s: float,
        clock_floor: float = 0.0,
    ) -> TrajectoryScored | None:
        """The `trajectory.scored` to emit now, if any (and records it as emitted).

        `clock_floor`: the grace period never counts from before this time (a restarted worker
        passes its start time, so trajectories restored from the table get a full grace period)."""
        missing = self.missing()
        quiet = now - max(self.last_change, clock_floor) >= grace_s
        if missing and not quiet:
            return None
        content = score_trajectory(self, trajectory_id, profiles, calibrations, missing)
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


def _clamp(x: float) -> float:
    return max(0.0, min(1.0, float(x)))


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


# --- scores (pure) --------------------------------------------------------------------------------


def weighted_mean(pairs: list[tuple[float, float | None]]) -> float | None:
    """Σ w·v / Σ w over the pairs whose value is not None and weight > 0; None if none.

    >>> weighted_mean([(0.4, 1.0), (0.5, 0.5), (0.1, None)])
    0.722222
    >>> weighted_mean([(0.4, None)]) is None
    True
    """
    present = [(w, v) for w, v in pairs if v is not None and w > 0]
    total = sum(w for w, _ in present)
    return round(sum(w * v for w, v in present) / total, 6) if total else None


def total_reward(
    outcome: float | None, process: float | None, efficiency_score: float | None, profile: DomainProfile
) -> float | None:
    """Weighted outcome / process / efficiency, renormalised over the components present.

    >>> from streams.rules.profiles import CODING
    >>> total_reward(0.75, 0.5, None, CODING), total_reward(None, None, None, CODING)
    (0.611111, None)
    """
    w = profile.reward_weights
    return weighted_mean([(w.outcome, outcome), (w.process, process), (w.efficiency, efficiency_score)])


def judge_layer(
    judged: dict[str, Any] | None, domain: str, calibrations: Calibrations, versions: set[str]
) -> tuple[float | None, dict[str, float]]:
    """A judge result's (calibrated) overall score and rubric scores; collects calibration versions."""
    if not judged or "score" not in judged:
        return None, {}
    rubric_scores = {}
    for rubric, value in sorted(judged["scores"].items()):
        rubric_scores[rubric], version = calibrations.apply(domain, rubric, value)
        versions.update([version] if version else [])
    score, version = calibrations.apply(domain, "overall", judged["score"])
    versions.update([version] if version else [])
    return _round(score), {k: _round(v) for k, v in rubric_scores.items()}


def _human_by_step(human: dict[str, dict[str, Any]]) -> dict[int | None, float]:
    groups: dict[int | None, list[float]] = {}
    for ann in human.values():
        groups.setdefault(ann["step"], []).append(ann["score"])
    return {k: round(sum(v) / len(v), 6) for k, v in groups.items()}


def _scored_steps(
    a: Assembly, domain: str, profile: DomainProfile, calibrations: Calibrations, versions: set[str]
):
    """Every step with its layers' scores and its process score (weighted mean of the layers)."""
    layers = profile.layers()
    traj_judge, _ = judge_layer(a.judge_trajectory, domain, calibrations, versions)
    human = _human_by_step(a.human)
    steps = []
    for index in sorted(set(a.steps) | set(a.rules)):
        rule = a.rules.get(index, {})
        judge, judge_scores = judge_layer(a.judge_steps.get(index), domain, calibrations, versions)
        judge = judge if judge is not None else traj_judge
        human_score = human.get(index, human.get(None))
        process = weighted_mean(
            [
                (layers.get("rule", 0.0), rule.get("score")),
                (layers.get("judge", 0.0), judge),
                (layers.get("human", 0.0), human_score),
            ]
        )
        steps.append(
            ScoredStep(
                step_index=index,
                **a.steps.get(index, {}),
                rule_score=rule.get("score"),
                redundancy=rule.get("redundancy"),
                regression=rule.get("regression"),
                info_utilization=rule.get("info_utilization"),
                judge_score=judge,
                judge_scores=judge_scores,
                human_score=human_score,
                process_score=process,
            )
        )
    return steps


def score_trajectory(
    a: Assembly,
    trajectory_id: str,
    profiles: ProfileRegistry,
    calibrations: Calibrations,
    missing: list[str] | None = None,
) -> TrajectoryScored:
    """The trajectory's content (event_id and revision are filled in by `Assembly.decide`)."""
    started = a.started or {}
    domain = started.get("domain") or "generic"
    profile = profiles.get(domain)
    versions: set[str] = set()
    steps = _scored_steps(a, domain, profile, calibrations, versions)
    n = a.expected_steps()
    present = [s.process_score for s in steps if s.process_score is not None]
    process = round(sum(present) / len(present), 6) if present else None
    outcome = _outcome(a.ended, profile)
    eff = _round(efficiency(started.get("reference_steps"), n)) if a.started else None
    rule_versions = sorted({r["version"] for r in a.rules.values()})
    return TrajectoryScored(
        event_id="pending",
        trajectory_id=trajectory_id,
        occurred_at=datetime.fromisoformat(a.latest_at),
        producer=PRODUCER,
        task_id=started.get("task_id") or "",
        task=started.get("task") or "",
        domain=domain,
        agent=started.get("agent") or "",
        model=started.get("model") or "",
        policy_version=started.get("policy_version"),
        group_id=started.get("group_id"),
        success=a.ended["success"] if a.ended else None,
        steps=steps,
        total_steps=n,
        outcome_score=outcome,
        process_score=process,
        efficiency_score=eff,
        total_reward=total_reward(outcome, process, eff, profile),
        complete=not (a.missing() if missing is None else missing),
        missing=a.missing() if missing is None else missing,
        reward_version="+".join([ASSEMBLY_VERSION, *rule_versions]),
        calibration_version=",".join(sorted(versions)) or None,
        started_at=datetime.fromisoformat(started["at"]) if a.started else None,
        ended_at=datetime.fromisoformat(a.ended["at"]) if a.ended else None,
        metadata=started.get("metadata") or {},
    )


def _outcome(ended: dict[str, Any] | None, profile: DomainProfile) -> float | None:
    if ended is None:
        return None
    passed, failed = ended["tests_passed"], ended["tests_failed"]
    outcome = {
        "success": ended["success"],
        "tests_passed": passed,
        "tests_failed": failed,
        "tests_total": (passed or 0) + (failed or 0) if passed is not None or failed is not None else None,
        "partial_credit": ended["score"],
    }
    return _round(outcome_score(outcome, profile.outcome))


def content_hash(event: TrajectoryScored) -> str:
    """A digest of everything but the envelope's id and the revision number."""
    body = event.model_dump(mode="json", exclude={"event_id", "revision"})
    return hashlib.blake2b(orjson.dumps(body, option=orjson.OPT_SORT_KEYS), digest_size=16).hexdigest()

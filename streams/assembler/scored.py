"""A trajectory's scored content: what an assembly joined, turned into `trajectory.scored` (pure).

The assembly state machine (streams/assembler/assembly.py) decides when to emit and hands its
joined input over as a `JoinedTrajectory`; this module only reads that value, so the import goes one
way (assembly -> scored).

Scores (`score_trajectory`; arithmetic in streams/assembler/reward_math.py):
- step process score = weighted mean of the layers present: rule (`reward.rule.step.score`), judge
  (the step's judge score, else the trajectory-level judge score), human (mean of the step's
  annotations, else of the trajectory-level ones), with the domain's layer weights
  (`DomainProfile.layers()`); None when no layer has a signal. A failed judge call is no score: the
  step is scored from the other layers. Judge scores are calibrated first when a calibration map
  exists for (domain, rubric) (`Calibrations`).
- process = mean of the step process scores present; outcome from `episode.ended` with the domain's
  outcome spec; efficiency from `episode.started.reference_steps`.
- total = weighted outcome / process / efficiency (domain weights, default 0.4 / 0.5 / 0.1),
  renormalised over the components that are not None.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from schemas.events import ScoredStep, TrajectoryScored, reward_definition
from streams.assembler import layers as L
from streams.assembler.reward_math import (
    Calibrations,
    human_by_step,
    judge_layer,
    outcome_of,
    round6,
    total_reward,
    weighted_mean,
)
from streams.rules.profiles import DomainProfile, ProfileRegistry
from streams.rules.rewards import efficiency

ASSEMBLY_VERSION = "assembly-1"
PRODUCER = "streams/assembler"
WEIGHT_KEYS = {L.RULES: "rule", L.JUDGE: "judge", L.HUMAN: "human"}  # layer -> DomainProfile.layers() key


@dataclass(frozen=True, slots=True)
class JoinedTrajectory:
    """What one trajectory's assembly has joined, as scoring reads it (`Assembly.joined()`).

    The parts are the assembly's own stored dicts (see `Assembly` for their shapes), not copies;
    `expected_steps`, `complete` and `missing` are the assembly's completeness at this moment."""

    started: dict[str, Any] | None
    ended: dict[str, Any] | None
    steps: dict[int, dict[str, Any]]
    rules: dict[int, dict[str, Any]]
    judge_steps: dict[int, dict[str, Any]]
    judge_trajectory: dict[str, Any] | None
    human: dict[str, dict[str, Any]]
    judge_mode: str | None
    latest_at: str
    expected_steps: int  # `episode.ended.total_steps`, else the highest step index seen + 1
    complete: bool  # no structure or rule reward absent (`Assembly.structure_missing()` is empty)
    missing: list[str]  # what the emission lacks (`Assembly.absent()`)


def _judge_target(a: JoinedTrajectory, index: int) -> dict[str, Any] | None:
    """The judge result that decides a step's judge layer: its own, else the trajectory's."""
    own = a.judge_steps.get(index)
    return own if a.judge_mode == "step" or own is not None else a.judge_trajectory


def _expected(a: JoinedTrajectory, index: int, wait_s: float | None) -> dict[str, str]:
    """The layers expected on a step -> why each would be missing (layers.py)."""
    expected = {L.RULES: L.rules_reason(a.rules.get(index), wait_s)}
    target = _judge_target(a, index)
    if a.judge_mode is not None or target is not None:
        expected[L.JUDGE] = L.judge_reason(target, wait_s)
    return expected


def _scored_steps(
    a: JoinedTrajectory,
    domain: str,
    profile: DomainProfile,
    calibrations: Calibrations,
    versions: set[str],
    wait_s: float | None = None,
) -> list[ScoredStep]:
    """Every step with its layers' scores, which layers it has or misses (and why), and its process
    score (weighted mean of the layers present)."""
    weights = profile.layers()
    traj_judge, _ = judge_layer(a.judge_trajectory, domain, calibrations, versions)
    human = human_by_step(a.human)
    steps = []
    for index in sorted(set(a.steps) | set(a.rules)):
        rule = a.rules.get(index, {})
        judge, judge_scores = judge_layer(a.judge_steps.get(index), domain, calibrations, versions)
        judge = judge if judge is not None else traj_judge
        scores = {L.RULES: rule.get("score"), L.JUDGE: judge, L.HUMAN: human.get(index, human.get(None))}
        present, missing = L.classify(scores, _expected(a, index, wait_s))
        process = weighted_mean([(weights.get(WEIGHT_KEYS[name], 0.0), v) for name, v in scores.items()])
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
                human_score=scores[L.HUMAN],
                process_score=process,
                layers=present,
                missing_layers=missing,
            )
        )
    return steps


def score_trajectory(
    a: JoinedTrajectory,
    trajectory_id: str,
    profiles: ProfileRegistry,
    calibrations: Calibrations,
    wait_s: float | None = None,
    rule_version: str | None = None,
) -> TrajectoryScored:
    """The trajectory's content (event_id and revision are filled in by `Assembly.decide`).
    `wait_s`: the wait that ran out (named in the missing reasons); `rule_version`: `_reward_version`."""
    started = a.started or {}
    domain = started.get("domain") or "generic"
    profile = profiles.get(domain)
    versions: set[str] = set()
    steps = _scored_steps(a, domain, profile, calibrations, versions, wait_s)
    n = a.expected_steps
    present = [s.process_score for s in steps if s.process_score is not None]
    process = round(sum(present) / len(present), 6) if present else None
    outcome = outcome_of(a.ended, profile)
    eff = round6(efficiency(started.get("reference_steps"), n)) if a.started else None
    reward_version = _reward_version(a.rules, rule_version)
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
        complete=a.complete,
        missing=a.missing,
        reward_version=reward_version,
        reward_definition=reward_definition([s.layers for s in steps], reward_version),
        calibration_version=",".join(sorted(versions)) or None,
        started_at=datetime.fromisoformat(started["at"]) if a.started else None,
        ended_at=datetime.fromisoformat(a.ended["at"]) if a.ended else None,
        metadata=started.get("metadata") or {},
        purpose=started.get("purpose") or "train",  # state stored before 1.5 has none
    )


def _reward_version(rules: dict[int, dict[str, Any]], rule_version: str | None) -> str:
    """`assembly-1+<rule_version>`: the assembler takes only rule rewards of its version, so this
    holds even before any arrived. None (pure callers): the versions of the rule rewards folded in.

    >>> _reward_version({}, "rules-2"), _reward_version({0: {"version": "r"}}, None)
    ('assembly-1+rules-2', 'assembly-1+r')
    """
    versions = [rule_version] if rule_version else sorted({r["version"] for r in rules.values()})
    return "+".join([ASSEMBLY_VERSION, *versions])

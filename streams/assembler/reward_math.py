"""The assembler's score arithmetic (pure): layer means, the trajectory total, judge calibration,
the outcome, and the content digest that decides whether an emission is new.

Imported by streams/assembler/assembly.py; it knows nothing of the per-trajectory state.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from schemas.events import TrajectoryScored
from streams.rules.profiles import DomainProfile
from streams.rules.rewards import outcome_score


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
        return clamp(mapping.apply(score)), mapping.version


def clamp(x: float) -> float:
    return max(0.0, min(1.0, float(x)))


def round6(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


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
    """A judge result's (calibrated) overall score and rubric scores; collects calibration versions.
    A failure (no `score` key) gives (None, {}): a failed call is never a score."""
    if not judged or "score" not in judged:
        return None, {}
    rubric_scores = {}
    for rubric, value in sorted(judged["scores"].items()):
        rubric_scores[rubric], version = calibrations.apply(domain, rubric, value)
        versions.update([version] if version else [])
    score, version = calibrations.apply(domain, "overall", judged["score"])
    versions.update([version] if version else [])
    return round6(score), {k: round6(v) for k, v in rubric_scores.items()}


def human_by_step(human: dict[str, dict[str, Any]]) -> dict[int | None, float]:
    """Mean human score per step index (None: the trajectory-level annotations)."""
    groups: dict[int | None, list[float]] = {}
    for ann in human.values():
        groups.setdefault(ann["step"], []).append(ann["score"])
    return {k: round(sum(v) / len(v), 6) for k, v in groups.items()}


def outcome_of(ended: dict[str, Any] | None, profile: DomainProfile) -> float | None:
    """The outcome score of a stored `episode.ended` under the domain's outcome spec."""
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
    return round6(outcome_score(outcome, profile.outcome))


def content_hash(event: TrajectoryScored) -> str:
    """A digest of everything but the envelope's id and the revision number."""
    body = event.model_dump(mode="json", exclude={"event_id", "revision"})
    return hashlib.blake2b(orjson.dumps(body, option=orjson.OPT_SORT_KEYS), digest_size=16).hexdigest()

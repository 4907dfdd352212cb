"""Human labels: building `feedback.annotation` events, and pairing them with judge scores.

Pure. `annotation_event` validates one label (from the CLI or a JSONL row) and gives it a
deterministic id, so importing the same file twice adds nothing. `pair_scores` matches every human
label with the judge's score for the same target and rubric, per (domain, rubric):

- a step label pairs with that step's `reward.judge.step` (the rubric's score; `overall` = the
  step's weighted score);
- a trajectory label pairs with the `reward.judge.trajectory` (same rule), or, when the trajectory
  was judged per step, with the mean of its step scores for that rubric;
- several labels for one target are averaged (one pair per target); a label without a judge score
  is counted as unmatched, never paired with a guess.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import ValidationError

from schemas.events import (
    EpisodeStarted,
    EventBase,
    FeedbackAnnotation,
    JudgeStep,
    JudgeTrajectory,
    utc_now,
)
from schemas.ids import derived_event_id
from streams.errors import AnnotationError

PRODUCER = "agentstream-annotate"
OVERALL = "overall"


def annotation_event(
    trajectory_id: str,
    rubric: str,
    score: float,
    step_index: int | None = None,
    annotator: str = "",
    comment: str = "",
    producer: str = PRODUCER,
) -> FeedbackAnnotation:
    """A validated `feedback.annotation`; the id is derived from its content."""
    event_id = derived_event_id(
        "feedback.annotation", trajectory_id, step_index, rubric, annotator, score, comment
    )
    try:
        return FeedbackAnnotation(
            event_id=event_id,
            trajectory_id=trajectory_id,
            occurred_at=utc_now(),
            producer=producer,
            step_index=step_index,
            rubric=rubric,
            score=score,
            annotator=annotator,
            comment=comment,
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']} (got {e.get('input')!r})" for e in exc.errors()
        )
        raise AnnotationError(problems) from None


def annotation_from_row(row: object) -> FeedbackAnnotation:
    """One JSONL row: {trajectory_id, rubric?, score, step_index?, annotator?, comment?}."""
    if not isinstance(row, dict):
        raise AnnotationError(f"a row must be a JSON object, got {row!r:.80}")
    missing = [k for k in ("trajectory_id", "score") if k not in row]
    if missing:
        raise AnnotationError(f"missing field(s) {missing} in row {row!r:.120}")
    return annotation_event(
        str(row["trajectory_id"]),
        str(row.get("rubric") or OVERALL),
        row["score"],
        row.get("step_index", row.get("step")),
        str(row.get("annotator") or ""),
        str(row.get("comment") or ""),
    )


@dataclass
class Pairs:
    """Matched (judge, human) scores per (domain, rubric), and what could not be matched."""

    by_key: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    unmatched: int = 0


def _judge_value(scores: dict[str, float], overall: float | None, rubric: str) -> float | None:
    return overall if rubric == OVERALL else scores.get(rubric)


@dataclass
class ScoreTables:
    """What pairing needs, from events (`from_events`) or from ClickHouse rows (`cli.py`)."""

    domains: dict[str, str] = field(default_factory=dict)
    steps: dict[tuple[str, int], tuple[dict[str, float], float | None]] = field(default_factory=dict)
    trajectories: dict[str, tuple[dict[str, float], float | None]] = field(default_factory=dict)
    labels: dict[tuple[str, int | None, str], list[float]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def from_events(cls, events: Iterable[EventBase]) -> ScoreTables:
        tables = cls()
        for e in events:
            if isinstance(e, EpisodeStarted):
                tables.domains[e.trajectory_id] = e.domain
            elif isinstance(e, JudgeStep):
                tables.steps[(e.trajectory_id, e.step_index)] = (dict(e.scores), e.score)
            elif isinstance(e, JudgeTrajectory):
                tables.trajectories[e.trajectory_id] = (dict(e.scores), e.score)
            elif isinstance(e, FeedbackAnnotation):
                tables.labels[(e.trajectory_id, e.step_index, e.rubric)].append(e.score)
        return tables


def pair_scores(events: Iterable[EventBase], domain: str | None = None) -> Pairs:
    """Pair human labels with judge scores (see the module docstring); `domain` filters."""
    return pair_tables(ScoreTables.from_events(events), domain)


def pair_tables(tables: ScoreTables, domain: str | None = None) -> Pairs:
    steps_of: dict[str, list[tuple[dict[str, float], float | None]]] = defaultdict(list)
    for (tid, _), judged in tables.steps.items():
        steps_of[tid].append(judged)
    pairs = Pairs()
    for (tid, step_index, rubric), human in sorted(tables.labels.items(), key=lambda kv: str(kv[0])):
        dom = tables.domains.get(tid, "generic")
        if domain is not None and dom != domain:
            continue
        auto = _auto_score(tid, step_index, rubric, tables, steps_of)
        if auto is None:
            pairs.unmatched += 1
            continue
        pairs.by_key.setdefault((dom, rubric), []).append((auto, sum(human) / len(human)))
    return pairs


def _auto_score(tid, step_index, rubric, tables: ScoreTables, steps_of) -> float | None:
    if step_index is not None:
        judged = tables.steps.get((tid, step_index))
        return _judge_value(*judged, rubric) if judged else None
    if tid in tables.trajectories:
        return _judge_value(*tables.trajectories[tid], rubric)
    values = [v for judged in steps_of.get(tid, []) if (v := _judge_value(*judged, rubric)) is not None]
    return sum(values) / len(values) if values else None

"""`feedback.human`: human annotations, and the calibration fitted from them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.bounded import Count, Id, Score, StepIndex, Text
from schemas.events.envelope import REDACTIONS_HELP, EventBase


class FeedbackAnnotation(EventBase):
    type: Literal["feedback.annotation"] = "feedback.annotation"
    step_index: StepIndex | None = Field(None, description="None: the annotation is for the trajectory")
    rubric: Id = "overall"
    score: Score
    annotator: Id = ""
    comment: Text = ""
    redactions: Count = Field(0, description=REDACTIONS_HELP)


class CalibrationUpdated(EventBase):
    """A fitted monotone map from automatic (judge) scores to human scores, per domain and rubric.

    Published on `feedback.human`; `trajectory_id` carries `calibration:<domain>:<rubric>` (the key).
    The map is piecewise-linear through (`xs`, `ys`), clamped outside; the newest `version` wins.
    """

    type: Literal["calibration.updated"] = "calibration.updated"
    version: str = Field(min_length=1)
    domain: str = "generic"
    rubric: str = "overall"
    xs: list[float] = Field(default_factory=list, description="automatic scores, ascending")
    ys: list[float] = Field(default_factory=list, description="calibrated scores, non-decreasing")
    metrics: dict[str, float] = Field(default_factory=dict, description="pearson, spearman, kendall, ...")
    n: Count = 0

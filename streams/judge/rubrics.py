"""Rubric sets per domain: what the judge scores and how the scores are weighted.

The built-in sets are the seed's (reference/seed-knowlyr-gym.md section 2.4). Only the rubrics
evaluated by a model are sent to the judge; rule rubrics (`info_utilization`, `non_redundancy`) are
the rule processor's and are listed here with `evaluator="rule"` so weights stay comparable.
A YAML/JSON file can override or add domains: `{domain: [{id, description, weight, evaluator}]}`.

>>> [r.id for r in rubrics_for("coding").model_rubrics]
['goal_progress', 'tool_choice', 'param_correctness']
>>> rubrics_for("no-such-domain").domain
'generic'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.errors import AgentstreamError


class RubricsError(AgentstreamError):
    """A rubric file that cannot be read or does not validate."""


class Rubric(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    name: str = ""
    description: str = ""
    weight: float = Field(ge=0.0, le=1.0)
    evaluator: Literal["model", "rule", "human"] = "model"


class RubricSet(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    domain: str
    rubrics: list[Rubric]

    @property
    def model_rubrics(self) -> list[Rubric]:
        return [r for r in self.rubrics if r.evaluator == "model"]

    def only(self, ids: list[str] | None) -> RubricSet:
        """This set restricted to `ids` (a rule's rubric list); unknown ids are an error."""
        if ids is None:
            return self
        known = {r.id: r for r in self.rubrics}
        missing = [i for i in ids if i not in known]
        if missing:
            raise RubricsError(
                f"rubrics {missing} are not in domain {self.domain!r} (known: {sorted(known)})"
            )
        return RubricSet(domain=self.domain, rubrics=[known[i] for i in ids])

    def weighted_score(self, scores: dict[str, float]) -> float | None:
        """Weighted mean of the model rubrics that were scored; None when none were.

        >>> rubrics_for("coding").weighted_score({"goal_progress": 1.0, "tool_choice": 0.0})
        0.6
        """
        present = [(r.weight, scores[r.id]) for r in self.model_rubrics if r.id in scores]
        total = sum(w for w, _ in present)
        if not present or total == 0:
            return None
        return round(sum(w * s for w, s in present) / total, 6)


def _r(rid: str, weight: float, description: str, evaluator: str = "model") -> Rubric:
    return Rubric(
        id=rid, name=rid.replace("_", " "), description=description, weight=weight, evaluator=evaluator
    )


_DEFAULT = [
    _r("goal_progress", 0.30, "How much this step moves the agent toward completing the task."),
    _r("tool_choice", 0.20, "Whether the tool chosen is the right one for what the step needs."),
    _r("param_correctness", 0.20, "Whether the tool's parameters are correct, complete and well-formed."),
    _r("info_utilization", 0.15, "Uses information from earlier observations.", "rule"),
    _r("non_redundancy", 0.15, "Does not repeat earlier work.", "rule"),
]

BUILTIN: dict[str, list[Rubric]] = {
    "generic": _DEFAULT,
    "coding": _DEFAULT,
    "browser": _DEFAULT,
    "crew": _DEFAULT,
    "conversation": [
        _r("relevance", 0.25, "The reply addresses what the user actually asked."),
        _r("completeness", 0.20, "The reply covers every part of the request."),
        _r("clarity", 0.20, "The reply is clear and well organised."),
        _r("actionability", 0.15, "The user can act on the reply."),
        _r("tone_fit", 0.10, "The tone suits the user and the situation."),
        _r("non_redundancy", 0.10, "Does not repeat earlier turns.", "rule"),
    ],
    "engineering": [
        _r("technical_accuracy", 0.30, "Technical statements and actions are correct."),
        _r("tool_usage", 0.20, "Tools are used appropriately and effectively."),
        _r("thoroughness", 0.20, "The step checks what needs checking; no important case is skipped."),
        _r("info_utilization", 0.15, "Uses information from earlier observations.", "rule"),
        _r("non_redundancy", 0.15, "Does not repeat earlier work.", "rule"),
    ],
    "advisory": [
        _r("analysis_depth", 0.25, "The analysis goes beyond the obvious and is well reasoned."),
        _r("recommendation_quality", 0.25, "Recommendations are specific, sound and prioritised."),
        _r("evidence_based", 0.20, "Claims are backed by evidence from the task or observations."),
        _r("risk_awareness", 0.15, "Risks and trade-offs are identified."),
        _r("stakeholder_consideration", 0.15, "The interests of those affected are considered."),
    ],
    "discussion": [
        _r("substantive_contribution", 0.25, "The contribution adds substance to the discussion."),
        _r("engagement_quality", 0.25, "It engages with what others said."),
        _r("professional_depth", 0.20, "It shows professional knowledge."),
        _r("constructive_challenge", 0.15, "It challenges ideas constructively where warranted."),
        _r("actionability", 0.15, "It leads toward decisions or next steps."),
    ],
}


class RubricCatalog:
    """Built-in rubric sets plus file overrides; unknown domains use `generic`."""

    def __init__(self, overrides: dict[str, list[Rubric]] | None = None):
        self._sets = {**BUILTIN, **(overrides or {})}

    @classmethod
    def load(cls, path: str | Path | None) -> RubricCatalog:
        if path is None or not Path(path).exists():
            return cls()
        text = Path(path).read_text()
        try:
            raw = json.loads(text) if Path(path).suffix.lower() == ".json" else _yaml(text)
            overrides = {d: [Rubric.model_validate(r) for r in items] for d, items in (raw or {}).items()}
        except (ValueError, AttributeError, TypeError) as exc:
            raise RubricsError(f"rubric file {path}: {exc}") from None
        return cls(overrides)

    def for_domain(self, domain: str) -> RubricSet:
        key = domain if domain in self._sets else "generic"
        return RubricSet(domain=key, rubrics=list(self._sets[key]))


def _yaml(text: str):
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from None


def rubrics_for(domain: str) -> RubricSet:
    """The built-in rubric set of a domain."""
    return RubricCatalog().for_domain(domain)

"""Rubric sets per domain: what the judge scores and how the scores are weighted.

The built-in sets come from the one catalogue, `streams.rubrics.BUILTIN_RUBRICS`, which the rule
profiles (`streams.rules.profiles`) are derived from too. Only the rubrics evaluated by a model are
sent to the judge; rule rubrics (`info_utilization`, `non_redundancy`) are the rule processor's and
are listed here with `evaluator="rule"` so weights stay comparable. Unknown domains (`crew`
included) use `generic`. A YAML/JSON file can override or add domains:
`{domain: [{id, description, weight, evaluator}]}`; no file given means the built-ins, a file given
that does not exist is a `RubricsError` naming it.

>>> [r.id for r in rubrics_for("coding").model_rubrics]
['goal_progress', 'tool_choice', 'param_correctness']
>>> rubrics_for("no-such-domain").domain
'generic'
>>> rubrics_for("crew").domain
'generic'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from streams.errors import RubricsError, option_file
from streams.rubrics import BUILTIN_RUBRICS, FALLBACK_DOMAIN, RubricDef


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


def _from_catalogue(rubrics: tuple[RubricDef, ...]) -> list[Rubric]:
    return [
        Rubric(
            id=r.id,
            name=r.id.replace("_", " "),
            description=r.description,
            weight=r.weight,
            evaluator=r.evaluator,
        )
        for r in rubrics
    ]


# The judge's view of the one built-in catalogue (streams.rubrics), which the rule profiles share.
BUILTIN: dict[str, list[Rubric]] = {domain: _from_catalogue(rs) for domain, rs in BUILTIN_RUBRICS.items()}


class RubricCatalog:
    """Built-in rubric sets plus file overrides; unknown domains use `generic`."""

    def __init__(self, overrides: dict[str, list[Rubric]] | None = None):
        self._sets = {**BUILTIN, **(overrides or {})}

    @classmethod
    def load(cls, path: str | Path | None) -> RubricCatalog:
        """Built-ins plus the overrides in `path`; no path given (None or empty) gives the built-ins,
        a path given that does not exist raises RubricsError naming it."""
        found = option_file(path, "rubrics file", RubricsError)
        if found is None:
            return cls()
        try:
            text = found.read_text()
            raw = json.loads(text) if found.suffix.lower() == ".json" else _yaml(text)
            overrides = {d: [Rubric.model_validate(r) for r in items] for d, items in (raw or {}).items()}
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            raise RubricsError(f"rubrics file {found}: {exc}") from None
        return cls(overrides)

    def for_domain(self, domain: str) -> RubricSet:
        key = domain if domain in self._sets else FALLBACK_DOMAIN
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

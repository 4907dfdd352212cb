"""The built-in rubric catalogue: per domain, which rubrics score a step, their weights, and who
evaluates each (a rule, the model judge, or a human).

The one source of truth for built-in rubrics: the rule profiles (`streams.rules.profiles`) and the
judge's rubric sets (`streams.judge.rubrics`) are both derived from `BUILTIN_RUBRICS`, so the rule
layer and the judge always weigh a domain the same way. Plain data; no I/O, no faust, no pydantic.

The sets are the seed's (reference/seed-knowlyr-gym.md section 2.4). The seed lists a `crew` domain
with the default set; it is not built in here (its seed profile is undocumented and its outcome spec
is a bug), so `crew`, like any unknown domain, resolves to `generic`, which has that same default set.

>>> [r.id for r in BUILTIN_RUBRICS["coding"] if r.evaluator == "rule"]
['info_utilization', 'non_redundancy']
>>> round(sum(r.weight for r in BUILTIN_RUBRICS["conversation"]), 6)
1.0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Evaluator = Literal["rule", "model", "human"]
EVALUATORS: tuple[str, ...] = ("rule", "model", "human")

# The two rubrics the rule layer scores (streams.rules.rewards); every other rubric is the model's.
INFO_UTILIZATION = "info_utilization"
NON_REDUNDANCY = "non_redundancy"
RULE_RUBRIC_IDS = frozenset({INFO_UTILIZATION, NON_REDUNDANCY})


@dataclass(frozen=True)
class RubricDef:
    """One built-in rubric: its id, weight in the domain's set, evaluator and what it asks."""

    id: str
    weight: float
    evaluator: Evaluator
    description: str


def default_evaluator(rubric_id: str) -> Evaluator:
    """Who scores a rubric that a user file lists without an evaluator."""
    return "rule" if rubric_id in RULE_RUBRIC_IDS else "model"


def _model(rid: str, weight: float, description: str) -> RubricDef:
    return RubricDef(rid, weight, "model", description)


def _info(weight: float) -> RubricDef:
    return RubricDef(INFO_UTILIZATION, weight, "rule", "Uses information from earlier observations.")


def _non_redundancy(weight: float, what: str = "work") -> RubricDef:
    return RubricDef(NON_REDUNDANCY, weight, "rule", f"Does not repeat earlier {what}.")


DEFAULT: tuple[RubricDef, ...] = (
    _model("goal_progress", 0.30, "How much this step moves the agent toward completing the task."),
    _model("tool_choice", 0.20, "Whether the tool chosen is the right one for what the step needs."),
    _model("param_correctness", 0.20, "Whether the tool's parameters are correct, complete and well-formed."),
    _info(0.15),
    _non_redundancy(0.15),
)
CONVERSATION: tuple[RubricDef, ...] = (
    _model("relevance", 0.25, "The reply addresses what the user actually asked."),
    _model("completeness", 0.20, "The reply covers every part of the request."),
    _model("clarity", 0.20, "The reply is clear and well organised."),
    _model("actionability", 0.15, "The user can act on the reply."),
    _model("tone_fit", 0.10, "The tone suits the user and the situation."),
    _non_redundancy(0.10, "turns"),
)
ENGINEERING: tuple[RubricDef, ...] = (
    _model("technical_accuracy", 0.30, "Technical statements and actions are correct."),
    _model("tool_usage", 0.20, "Tools are used appropriately and effectively."),
    _model("thoroughness", 0.20, "The step checks what needs checking; no important case is skipped."),
    _info(0.15),
    _non_redundancy(0.15),
)
ADVISORY: tuple[RubricDef, ...] = (
    _model("analysis_depth", 0.25, "The analysis goes beyond the obvious and is well reasoned."),
    _model("recommendation_quality", 0.25, "Recommendations are specific, sound and prioritised."),
    _model("evidence_based", 0.20, "Claims are backed by evidence from the task or observations."),
    _model("risk_awareness", 0.15, "Risks and trade-offs are identified."),
    _model("stakeholder_consideration", 0.15, "The interests of those affected are considered."),
)
DISCUSSION: tuple[RubricDef, ...] = (
    _model("substantive_contribution", 0.25, "The contribution adds substance to the discussion."),
    _model("engagement_quality", 0.25, "It engages with what others said."),
    _model("professional_depth", 0.20, "It shows professional knowledge."),
    _model("constructive_challenge", 0.15, "It challenges ideas constructively where warranted."),
    _model("actionability", 0.15, "It leads toward decisions or next steps."),
)

# Domain -> its rubric set. Unknown domains (crew included) use "generic".
BUILTIN_RUBRICS: dict[str, tuple[RubricDef, ...]] = {
    "generic": DEFAULT,
    "coding": DEFAULT,
    "browser": DEFAULT,
    "conversation": CONVERSATION,
    "engineering": ENGINEERING,
    "advisory": ADVISORY,
    "discussion": DISCUSSION,
}
FALLBACK_DOMAIN = "generic"

"""Which reward layers a step has, which expected ones it misses, and why (pure, no I/O).

Layers (`schemas.events.LAYERS`): `rules` (reward.rule.step), `judge` (the step's
reward.judge.step, else the trajectory's reward.judge.trajectory) and `human` (feedback
annotations). A layer is *present* on a step when it gives the step a score; the step's process
score is computed from present layers only. A layer is *expected*: rules always; the judge when the
judge rules select the trajectory (`judge_mode`), or when the judge tried it anyway; humans never.

A judge result is stored per target (a step, or the trajectory) as one of:
- `{"score", "scores"}`: scored. Final: a later failure for the target is ignored.
- `{"failed", "kind", "retry_at", "at", "id"}`: the newest `reward.judge.failed` (by occurred_at,
  then event id); a later score replaces it. It is *pending* when kind is `budget_paused` with a
  `retry_at` after the failure (the judge runs it again once its budget window reopens), else it
  failed for good.
The assembler waits for pending and not yet arrived judge results (its grace period), never for
failed ones; when the wait runs out it gives them up and says so in the reason.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from schemas.events import LAYERS, JudgeFailed

RULES, JUDGE, HUMAN = LAYERS

Entry = dict[str, Any] | None


def failure_entry(e: JudgeFailed) -> dict[str, Any]:
    """How a `reward.judge.failed` is kept in the assembly state."""
    return {
        "failed": e.reason,
        "kind": e.kind,
        "retry_at": e.retry_at.isoformat() if e.retry_at else None,
        "at": e.occurred_at.isoformat(),
        "id": e.event_id,
    }


def fold_failure(current: Entry, failure: dict[str, Any]) -> Entry:
    """What a target holds after `failure` arrives; None when it is ignored (a score stands).

    >>> old = {"failed": "x", "kind": "budget_paused", "at": "2026-01-01T10:00:00+00:00", "id": "a"}
    >>> new = old | {"at": "2026-01-01T11:00:00+00:00", "id": "b"}
    >>> fold_failure(old, new)["id"], fold_failure(new, old)["id"], fold_failure({"score": 1}, new)
    ('b', 'b', None)
    """
    if current is not None and "score" in current:
        return None
    if current is None or _order(failure) >= _order(current):
        return failure
    return current


def _order(entry: dict[str, Any]) -> tuple[str, str]:
    return entry.get("at", ""), entry.get("id", "")


def is_pending(entry: Entry) -> bool:
    """A budget-paused failure with a `retry_at` after it: the judge will try again.

    >>> paused = {"failed": "budget", "kind": "budget_paused", "at": "2026-01-01T10:00:00+00:00"}
    >>> is_pending(paused | {"retry_at": "2026-01-01T11:00:00+00:00"}), is_pending(paused)
    (True, False)
    """
    if not entry or "score" in entry or entry.get("kind") != "budget_paused" or not entry.get("retry_at"):
        return False
    at = entry.get("at") or entry["retry_at"]  # state stored before `at` was kept: not pending
    return datetime.fromisoformat(entry["retry_at"]) > datetime.fromisoformat(at)


def settled(entry: Entry) -> bool:
    """Nothing more to wait for: scored, or failed for good."""
    return entry is not None and not is_pending(entry)


def scored(entry: Entry) -> bool:
    return entry is not None and "score" in entry


def judge_reason(entry: Entry, wait_s: float | None) -> str:
    """Why an expected judge layer is missing, for `ScoredStep.missing_layers`."""
    if entry is None:
        return _waited("no judge result", wait_s)
    if "score" in entry:
        return "the judge gave no overall score"
    kind = entry.get("kind") or "error"
    if is_pending(entry):
        return _waited(f"pending ({kind} until {entry['retry_at']}): {entry['failed']}", wait_s)
    return f"failed ({kind}): {entry['failed']}"


def rules_reason(rule: Entry, wait_s: float | None) -> str:
    """Why the rules layer is missing: the reward never came, or it has no signal for this step."""
    if rule is None:
        return _waited("no reward.rule.step", wait_s)
    return "no signal: no rule component applies to this step"


def _waited(what: str, wait_s: float | None) -> str:
    return what if wait_s is None else f"{what}; given up after the {wait_s:g}s wait"


def classify(scores: dict[str, float | None], expected: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """(present layers, expected layers that are not present -> reason).

    >>> classify({"rules": 0.5, "judge": None, "human": None}, {"rules": "-", "judge": "failed"})
    (['rules'], {'judge': 'failed'})
    """
    present = [name for name in LAYERS if scores.get(name) is not None]
    return present, {name: why for name, why in expected.items() if name not in present}

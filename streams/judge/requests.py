"""Pure: judge requests (what to ask, about which targets) and the events that answer them.

A `JudgeRequest` is one model call: a prompt plus the targets it covers (several steps of one
trajectory, one trajectory, or every trajectory of a group). `reply_events` turns the model's
reply into one `reward.judge.step` / `reward.judge.trajectory` per target, or a
`reward.judge.failed` for a target the reply did not score; `failure_events` does the same for a
call that failed. Ids are deterministic in (target, source event, prompt version, configured
model), so a replay publishes the same ids. Tokens and cost of a call covering several targets are
split across them, so sums over events equal what was paid.

>>> split_evenly(10, 3)
[4, 3, 3]
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from schemas.events import EventBase, JudgeFailed, JudgeStep, JudgeTrajectory
from schemas.ids import derived_event_id
from streams.judge.parse import Judgment, parse_group, parse_steps, parse_trajectory
from streams.judge.prompt import Prompt
from streams.judge.rubrics import RubricSet

PRODUCER = "judge"


@dataclass(frozen=True)
class Target:
    """One thing the call scores: a step (step_index set) or a trajectory (label set in group mode)."""

    trajectory_id: str
    source_event_id: str
    step_index: int | None = None
    label: str = ""
    group_id: str | None = None


@dataclass(frozen=True)
class JudgeRequest:
    mode: Literal["step", "trajectory", "group"]
    prompt: Prompt
    rubrics: RubricSet
    targets: Sequence[Target]
    model: str = field(default="")

    @property
    def rubric_ids(self) -> list[str]:
        return [r.id for r in self.rubrics.model_rubrics]


@dataclass(frozen=True)
class CallMeta:
    """What one call cost and who made it; shared across the call's targets."""

    judge_model: str
    prompt_version: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    latency_ms: float = 0.0
    cached: bool = False


def split_evenly(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, max(1, parts))
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _shares(meta: CallMeta, n: int) -> list[dict]:
    ins, outs = split_evenly(meta.input_tokens, n), split_evenly(meta.output_tokens, n)
    cost = round(meta.cost_usd / max(1, n), 9)
    return [
        {
            "judge_model": meta.judge_model,
            "prompt_version": meta.prompt_version,
            "input_tokens": ins[i],
            "output_tokens": outs[i],
            "cost_usd": cost,
            "latency_ms": round(meta.latency_ms, 3),
            "cached": meta.cached,
        }
        for i in range(n)
    ]


def target_event_id(event_type: str, request: JudgeRequest, target: Target, *extra: object) -> str:
    where = target.step_index if target.step_index is not None else "trajectory"
    return derived_event_id(
        event_type,
        target.trajectory_id,
        where,
        target.source_event_id,
        request.prompt.version,
        request.model,
        request.mode,
        rubric_fingerprint(request.rubrics),
        *extra,
    )


def rubric_fingerprint(rubrics: RubricSet) -> str:
    """Changes when the scored rubrics change (an override file), so new judgments get new ids."""
    text = "|".join(f"{r.id}:{r.weight}:{r.description}" for r in rubrics.model_rubrics)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def reply_events(request: JudgeRequest, text: str, meta: CallMeta, now: datetime) -> list[EventBase]:
    """Events for a reply. Raises ParseError when nothing in it can be read (the caller then
    publishes `failure_events` with kind "parse")."""
    judgments = _parse(request, text)
    shares = _shares(meta, len(request.targets))
    events: list[EventBase] = []
    for target, share in zip(request.targets, shares, strict=True):
        judgment = judgments.get(target.step_index if request.mode == "step" else target.label)
        if judgment is None or not judgment.scores:
            why = "; ".join(judgment.problems) if judgment else "the reply does not cover it"
            events.append(_failed(request, target, f"model gave no usable score: {why}", "parse", now, share))
        else:
            events.append(_scored(request, target, judgment, share, now))
    return events


def _parse(request: JudgeRequest, text: str) -> dict:
    ids = request.rubric_ids
    if request.mode == "step":
        return parse_steps(text, ids, [t.step_index for t in request.targets])
    if request.mode == "group":
        return parse_group(text, ids, [t.label for t in request.targets])
    return {request.targets[0].label: parse_trajectory(text, ids)}


def _scored(
    request: JudgeRequest, target: Target, judgment: Judgment, share: dict, now: datetime
) -> EventBase:
    common = {
        "trajectory_id": target.trajectory_id,
        "occurred_at": now,
        "producer": PRODUCER,
        "scores": judgment.scores,
        "score": request.rubrics.weighted_score(judgment.scores),
        "rationale": judgment.rationale,
        **share,
    }
    if request.mode == "step":
        return JudgeStep(
            event_id=target_event_id("reward.judge.step", request, target),
            step_index=target.step_index,
            source_event_id=target.source_event_id,
            **common,
        )
    return JudgeTrajectory(
        event_id=target_event_id("reward.judge.trajectory", request, target),
        group_id=target.group_id,
        mode="group" if request.mode == "group" else "trajectory",
        **common,
    )


def _failed(
    request: JudgeRequest,
    target: Target,
    reason: str,
    kind: str,
    now: datetime,
    share: dict | None = None,
    attempts: int = 0,
    retry_at: datetime | None = None,
) -> JudgeFailed:
    return JudgeFailed(
        event_id=target_event_id("reward.judge.failed", request, target, kind),
        trajectory_id=target.trajectory_id,
        occurred_at=now,
        producer=PRODUCER,
        reason=reason[:2000],
        kind=kind,
        step_index=target.step_index,
        judge_model=(share or {}).get("judge_model", request.model),
        prompt_version=request.prompt.version,
        attempts=attempts,
        retry_at=retry_at,
        input_tokens=(share or {}).get("input_tokens", 0),
        output_tokens=(share or {}).get("output_tokens", 0),
        cost_usd=(share or {}).get("cost_usd", 0.0),
    )


def failure_events(
    request: JudgeRequest,
    reason: str,
    kind: str,
    now: datetime,
    attempts: int = 0,
    retry_at: datetime | None = None,
    meta: CallMeta | None = None,
) -> list[EventBase]:
    """One `reward.judge.failed` per target of a call that produced no scores. Never a score.
    `meta` carries what an unusable reply cost (split across the targets)."""
    shares = _shares(meta, len(request.targets)) if meta else [None] * len(request.targets)
    return [
        _failed(request, t, reason, kind, now, share, attempts, retry_at)
        for t, share in zip(request.targets, shares, strict=True)
    ]


__all__ = ["CallMeta", "JudgeRequest", "Target", "failure_events", "reply_events", "split_evenly"]

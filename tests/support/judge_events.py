"""Agent events for the judge tests (processor unit tests and the worker integration test)."""

from __future__ import annotations

from datetime import UTC, datetime

from schemas.events import EpisodeEnded, EpisodeStarted, StepRecorded

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def started(tid, domain="coding", agent="bot", group_id=None, task="fix the failing test", **meta):
    return EpisodeStarted(
        event_id=f"{tid}-start", trajectory_id=tid, occurred_at=T0, producer="test", task_id="task-1",
        task=task, domain=domain, agent=agent, model="m", group_id=group_id, metadata=meta,
    )  # fmt: skip


def step(tid, i, observation="3 passed", tool="bash"):
    return StepRecorded(
        event_id=f"{tid}-step-{i}", trajectory_id=tid, occurred_at=T0, producer="test", step_index=i,
        tool=tool, params={"cmd": f"pytest -k t{i}"}, observation=observation, exit_code=0,
    )  # fmt: skip


def ended(tid, success=True):
    return EpisodeEnded(
        event_id=f"{tid}-end", trajectory_id=tid, occurred_at=T0, producer="test", success=success
    )


def trajectory(tid, n=2, **kw):
    return [started(tid, **kw), *(step(tid, i) for i in range(n)), ended(tid)]

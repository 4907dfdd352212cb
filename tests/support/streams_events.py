"""Scored-trajectory building blocks shared by the streams unit tests (assembler, processors)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from schemas.events import EpisodeEnded, EpisodeStarted, JudgeStep, StepRecorded
from streams.rules.profiles import ProfileRegistry
from streams.rules.rewards import StepInput
from streams.rules.stream import TrajectoryRules

T0 = datetime(2026, 1, 1, tzinfo=UTC)
REG = ProfileRegistry()
STEPS = [
    StepInput("read_file", {"file_path": "/a.py"}, "src/util.py"),
    StepInput("read_file", {"file_path": "/a.py"}),
    StepInput("bash", {"command": "python src/util.py"}),
]


def judge_steps(count: int, score: float, tid: str = "t") -> list[JudgeStep]:
    """`reward.judge.step` events for steps 0..count-1 of trajectory `tid`."""
    return [
        JudgeStep(
            event_id=f"j{i}",
            trajectory_id=tid,
            occurred_at=T0,
            producer="judge",
            judge_model="m",
            prompt_version="p",
            step_index=i,
            score=score,
        )
        for i in range(count)
    ]


def trajectory(tid="t", steps=STEPS, domain="coding", reference_steps=None, passed=3, failed=1):
    started = EpisodeStarted(
        event_id=f"{tid}-s",
        trajectory_id=tid,
        occurred_at=T0,
        producer="t",
        task_id="task",
        domain=domain,
        reference_steps=reference_steps,
    )
    recorded = [
        StepRecorded(
            event_id=f"{tid}-{i}",
            trajectory_id=tid,
            occurred_at=T0 + timedelta(seconds=i + 1),
            producer="t",
            step_index=i,
            tool=s.tool,
            params=dict(s.params),
            observation=s.output,
        )
        for i, s in enumerate(steps)
    ]
    ended = EpisodeEnded(
        event_id=f"{tid}-e",
        trajectory_id=tid,
        occurred_at=T0 + timedelta(seconds=99),
        producer="t",
        success=True,
        tests_passed=passed,
        tests_failed=failed,
        total_steps=len(steps),
    )
    rules = TrajectoryRules()
    rules.on_started(started)
    for s in recorded:
        rules.on_step(s)
    rewards = rules.advance(tid, REG)
    return started, recorded, ended, rewards

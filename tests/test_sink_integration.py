"""The real sink process between the embedded broker and chDB (or Kafka + ClickHouse server under
`--engine docker`): typed values, dead letters, replay, kill -9, and the leaderboard's numbers."""

from __future__ import annotations

import json
import math
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from scipy import stats

from schemas.events import (
    EpisodeEnded,
    EpisodeStarted,
    FeedbackAnnotation,
    JudgeStep,
    RuleRewardStep,
    ScoredStep,
    StepRecorded,
    TrajectoryScored,
)
from schemas.topics import AGENT_EVENTS, DLQ
from tests.sink_fixtures.harness import group_caught_up, publish, reader, rows, scalar, snapshot, start_sink
from tests.support.processes import AGENTSTREAM, wait_for

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def _env(tid: str, eid: str, seconds: float = 0) -> dict:
    return {
        "event_id": eid,
        "trajectory_id": tid,
        "occurred_at": T0 + timedelta(seconds=seconds),
        "producer": "test",
    }


def test_events_land_in_their_tables_and_poison_goes_to_dead_letters(broker, clickhouse_url, tmp_path):
    sink = start_sink(broker.bootstrap, clickhouse_url, tmp_path / "sink")
    try:
        tid = "traj-typed"
        publish(
            broker.bootstrap,
            [
                EpisodeStarted(
                    task_id="fix-bug",
                    domain="code",
                    agent="a1",
                    model="m1",
                    policy_version="v3",
                    **_env(tid, "es"),
                ),
                StepRecorded(
                    step_index=0,
                    tool="bash",
                    params={"cmd": "pytest"},
                    observation="x" * 2048,
                    exit_code=1,
                    error="tests failed",
                    latency_ms=31.5,
                    **_env(tid, "s0", 1),
                ),
                RuleRewardStep(
                    step_index=0,
                    redundancy=1.0,
                    regression=None,
                    info_utilization=0.5,
                    score=0.75,
                    domain="code",
                    reward_version="rules-1",
                    source_event_id="s0",
                    **_env(tid, "r0", 2),
                ),
                JudgeStep(
                    step_index=0,
                    scores={"progress": 0.25},
                    score=0.25,
                    judge_model="claude",
                    prompt_version="p1",
                    cost_usd=0.002,
                    **_env(tid, "j0", 3),
                ),
                FeedbackAnnotation(step_index=0, score=0.5, annotator="ann", **_env(tid, "h0", 4)),
                EpisodeEnded(success=True, score=0.9, total_steps=1, **_env(tid, "ee", 5)),
            ],
            raw=[(AGENT_EVENTS, b"bad", b"{not json"), (DLQ, b"bad", b"\xff\xfe not a dead letter")],
        )
        # unwritable: decodes (non-negative int) but does not fit the UInt32 column
        publish(broker.bootstrap, [StepRecorded(step_index=2**40, tool="x", **_env(tid, "s-huge", 6))])
        publish(broker.bootstrap, [StepRecorded(step_index=1, tool="edit", **_env(tid, "s1", 7))])
        client = reader(clickhouse_url)
        wait_for(
            lambda: scalar(client, "SELECT count() FROM agentstream.steps FINAL WHERE event_id = 's1'"),
            timeout_s=30,
            what="the step published after the poison records",
        )
        wait_for(
            lambda: scalar(client, "SELECT count() FROM agentstream.dead_letters FINAL") == 3,
            timeout_s=30,
            what="three dead letters",
        )

        episode = rows(
            client,
            "SELECT task_id, domain, agent, model, policy_version, success, score, total_steps "
            "FROM agentstream.episodes FINAL WHERE trajectory_id = 'traj-typed'",
        )
        assert episode == [("fix-bug", "code", "a1", "m1", "v3", 1, 0.9, 1)]
        step = rows(
            client,
            "SELECT step_index, tool, params, length(observation), exit_code, error, latency_ms "
            "FROM agentstream.steps FINAL WHERE event_id = 's0'",
        )
        assert step == [(0, "bash", '{"cmd":"pytest"}', 2048, 1, "tests failed", 31.5)]
        rule = rows(
            client,
            "SELECT redundancy, regression, info_utilization, score, reward_version "
            "FROM agentstream.rule_rewards FINAL",
        )
        assert rule == [(1.0, None, 0.5, 0.75, "rules-1")]
        judge = rows(
            client,
            "SELECT kind, step_index, scores, score, judge_model, cost_usd FROM agentstream.judge_scores",
        )
        assert judge == [("step", 0, {"progress": 0.25}, 0.25, "claude", 0.002)]
        assert rows(client, "SELECT step_index, score FROM agentstream.annotations") == [(0, 0.5)]
        events = dict(
            rows(
                client,
                "SELECT event_id, topic FROM agentstream.events FINAL WHERE trajectory_id = 'traj-typed'",
            )
        )
        assert {"es", "s0", "r0", "j0", "h0", "ee", "s1"} <= set(events) and events["r0"] == "reward.rule"

        dead = rows(
            client,
            "SELECT stage, source_topic, source_offset, error_type, reason, payload "
            "FROM agentstream.dead_letters FINAL ORDER BY source_topic, error_type",
        )
        assert [(d[0], d[1], d[3]) for d in dead] == [
            ("sink", AGENT_EVENTS, "DataError"),
            ("sink", AGENT_EVENTS, "DecodeError"),
            ("sink", DLQ, "DecodeError"),
        ]
        assert "steps" in dead[0][4] and "s-huge" in dead[0][5]
        assert "not valid JSON" in dead[1][4] and dead[1][5] == "{not json"
        # the sink's own dead letters were published to the DLQ topic and read back from it
        assert scalar(client, f"SELECT count() FROM agentstream.events FINAL WHERE topic = '{DLQ}'") == 2
        assert sink.proc.alive()
        client.close()
    finally:
        sink.proc.stop()

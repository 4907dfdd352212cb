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

from infra.clickhouse.examples import EXAMPLES
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
from tests.support.processes import AGENTSTREAM, wait_for
from tests.support.sink_harness import (
    group_caught_up,
    group_members,
    publish,
    reader,
    rows,
    scalar,
    snapshot,
    start_sink,
)

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
        from producers.sdk.recorder import AgentRecorder

        recorder = AgentRecorder(broker.bootstrap, tmp_path / "sdk", agent="sdk-agent", model="sdk-model")
        with recorder.episode(task_id="sdk-task", domain="sdk", trajectory_id="traj-sdk") as episode:
            episode.step(thought="look", tool="bash", params={"cmd": "ls"}, observation="a.py", exit_code=0)
            episode.step(tool="edit", observation="done")
            episode.end(success=True, score=1.0)
        assert recorder.flush(timeout=30)
        recorder.close()
        # out of the contract's bounds (written past validation): refused at decode, never inserted
        huge = StepRecorded.model_construct(step_index=2**40, tool="x", **_env(tid, "s-huge", 6))
        publish(broker.bootstrap, [huge])
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

        sdk_where = "FINAL WHERE trajectory_id = 'traj-sdk'"
        count_sql = f"SELECT count() FROM agentstream.steps {sdk_where}"
        wait_for(lambda: scalar(client, count_sql) == 2, timeout_s=30, what="the SDK's steps")
        episode_sql = (
            f"SELECT task_id, domain, agent, model, success, score FROM agentstream.episodes {sdk_where}"
        )
        sdk = rows(client, episode_sql)
        assert sdk == [("sdk-task", "sdk", "sdk-agent", "sdk-model", 1, 1.0)]
        steps_sql = (
            f"SELECT step_index, tool, params, observation, exit_code FROM agentstream.steps {sdk_where}"
        )
        sdk_steps = rows(client, steps_sql + " ORDER BY step_index")
        assert sdk_steps == [(0, "bash", '{"cmd":"ls"}', "a.py", 0), (1, "edit", "{}", "done", None)]
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
            ("sink", AGENT_EVENTS, "DecodeError"),
            ("sink", AGENT_EVENTS, "DecodeError"),
            ("sink", DLQ, "DecodeError"),
        ]
        huge_letter, bad_json = sorted(dead[:2], key=lambda d: "s-huge" not in d[5])
        assert "step_index" in huge_letter[4] and "s-huge" in huge_letter[5]
        assert "not valid JSON" in bad_json[4] and bad_json[5] == "{not json"
        # the sink's own dead letters were published to the DLQ topic and read back from it
        assert scalar(client, f"SELECT count() FROM agentstream.events FINAL WHERE topic = '{DLQ}'") == 2
        assert sink.proc.alive()
        client.close()
    finally:
        sink.proc.stop()


# --- replay, kill -9 and the leaderboard --------------------------------------------------------

MODELS = {"m-good": 0.8, "m-mid": 0.6, "m-bad": 0.4}
DOMAINS = ("code", "web")
PER_GROUP = 10
STEPS = 5


def _workload(seed: int = 3):
    """Events of 60 trajectories, and the truth: (domain, model) -> [(success, final reward)]."""
    rng = np.random.default_rng(seed)
    events, truth = [], {}
    for domain in DOMAINS:
        for model, mean in MODELS.items():
            for i in range(PER_GROUP):
                tid = f"{domain}-{model}-{i}"
                reward = float(np.clip(rng.normal(mean, 0.1), 0, 1))
                success = bool(rng.random() < mean)
                truth.setdefault((domain, model), []).append((success, reward))
                events += _trajectory(tid, domain, model, success, reward)
    return events, truth


def _trajectory(tid, domain, model, success, reward):
    out = [
        EpisodeStarted(task_id=tid[:-2], domain=domain, model=model, agent="agent", **_env(tid, f"{tid}-s"))
    ]
    for k in range(STEPS):
        out.append(
            StepRecorded(step_index=k, tool="bash", observation="o" * 200, **_env(tid, f"{tid}-{k}", k + 1))
        )
        out.append(
            RuleRewardStep(
                step_index=k,
                score=0.5,
                reward_version="r1",
                source_event_id=f"{tid}-{k}",
                domain=domain,
                **_env(tid, f"{tid}-r{k}", k + 1),
            )
        )
    out.append(EpisodeEnded(success=success, score=reward, total_steps=STEPS, **_env(tid, f"{tid}-e", 9)))
    scored = {
        "task_id": tid[:-2],
        "domain": domain,
        "model": model,
        "success": success,
        "total_steps": STEPS,
        "steps": [ScoredStep(step_index=k, process_score=0.5) for k in range(STEPS)],
    }
    # the final revision is published first: the revision number, not arrival order, must win
    out.append(TrajectoryScored(revision=1, total_reward=reward, **scored, **_env(tid, f"{tid}-t1", 11)))
    out.append(TrajectoryScored(revision=0, total_reward=reward / 2, **scored, **_env(tid, f"{tid}-t0", 10)))
    return out


def _expected_leaderboard(truth) -> dict:
    expected = {}
    for domain in DOMAINS:
        groups = {m: np.array([r for _, r in truth[(domain, m)]]) for m in MODELS}
        best = max(groups, key=lambda m: groups[m].mean())
        raw = {
            m: stats.ttest_ind(groups[m], groups[best], equal_var=False).pvalue for m in groups if m != best
        }
        order = sorted(raw, key=raw.get)
        holm, running = {}, 0.0
        for rank, m in enumerate(order):
            running = max(running, min(1.0, (len(order) - rank) * raw[m]))
            holm[m] = running
        rng = np.random.default_rng(999)
        for m, x in groups.items():
            means = x[rng.integers(0, x.size, (5000, x.size))].mean(axis=1)
            expected[(domain, m)] = {
                "episodes": x.size,
                "success_rate": float(np.mean([s for s, _ in truth[(domain, m)]])),
                "mean_reward": float(x.mean()),
                "ci95": tuple(np.percentile(means, [2.5, 97.5])),
                "p": raw.get(m, math.nan),
                "p_holm": holm.get(m, math.nan),
                "best": m == best,
            }
    return expected


def _cli_leaderboard(url: str) -> list[dict]:
    out = subprocess.run(
        [*AGENTSTREAM, "leaderboard", "--clickhouse-url", url, "--by", "model", "--format", "json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def _publish_slowly(bootstrap, events, chunks=8):
    size = math.ceil(len(events) / chunks)
    for start in range(0, len(events), size):
        publish(bootstrap, events[start : start + size])
        time.sleep(0.3)


def test_kill9_replay_and_leaderboard(broker, clickhouse_url, tmp_path):
    events, truth = _workload()
    n_traj = len(DOMAINS) * len(MODELS) * PER_GROUP
    first = start_sink(broker.bootstrap, clickhouse_url, tmp_path / "sink", name="first")
    publisher = threading.Thread(target=_publish_slowly, args=(broker.bootstrap, events))
    publisher.start()
    client = reader(clickhouse_url)
    wait_for(lambda: scalar(client, "SELECT count() FROM agentstream.events") >= len(events) // 5,
             timeout_s=60, what="part of the load to be written")  # fmt: skip
    client.close()
    first.proc.kill9()  # mid-load: some batches written but not committed, some not written at all
    publisher.join()
    # the killed member leaves the group when its session expires (--session-timeout-ms, 10 s)
    wait_for(
        lambda: group_members(broker.bootstrap) == 0,
        timeout_s=30,
        what="the killed member's session to expire",
    )

    second = start_sink(broker.bootstrap, clickhouse_url, tmp_path / "sink", name="second")
    try:
        wait_for(lambda: group_caught_up(broker.bootstrap), timeout_s=90, what="the sink to catch up")
        client = reader(clickhouse_url)
        # nothing lost, nothing duplicated in the deduplicated views
        assert rows(client, "SELECT count(), uniqExact(event_id) FROM agentstream.events FINAL") == [
            (len(events), len(events))
        ]
        assert scalar(client, "SELECT count() FROM agentstream.steps FINAL") == n_traj * STEPS
        assert scalar(client, "SELECT count() FROM agentstream.rule_rewards FINAL") == n_traj * STEPS
        assert scalar(client, "SELECT count() FROM agentstream.episodes FINAL WHERE success IS NOT NULL "
                              "AND domain IS NOT NULL") == n_traj  # fmt: skip
        final = dict(
            rows(client, "SELECT trajectory_id, (revision, total_reward) FROM agentstream.trajectories FINAL")
        )
        assert len(final) == n_traj
        assert final["code-m-good-0"] == (1, pytest.approx(truth[("code", "m-good")][0][1]))
        before = snapshot(client)
        board_before = _cli_leaderboard(clickhouse_url)
        # the refreshable materialized copy converges to the exact view
        from clients.clickhouse.client import connect

        refresher = connect(clickhouse_url, role="writer")  # SYSTEM is refused for a reader
        refresher.command("SYSTEM REFRESH VIEW agentstream.leaderboard_snapshot_refresh")
        refresher.close()
        exact = "SELECT * FROM agentstream.leaderboard ORDER BY domain, model, day"
        copy = "SELECT * FROM agentstream.leaderboard_snapshot ORDER BY domain, model, day"
        wait_for(
            lambda: rows(client, copy) == rows(client, exact), timeout_s=30, what="the leaderboard refresh"
        )
        for name, sql in EXAMPLES.items():
            assert rows(client, sql), name
        best = {r[0]: r[1] for r in rows(client, EXAMPLES["best_model_per_domain"])}
        assert best == {"code": "m-good", "web": "m-good"}
        args = ["trajectory", "web-m-bad-3", "--clickhouse-url", clickhouse_url, "--format", "json"]
        view = subprocess.run([*AGENTSTREAM, *args], capture_output=True, text=True, timeout=60, check=True)
        shown = json.loads(view.stdout)
        assert shown["episode"]["model"] == "m-bad" and shown["episode"]["reward"] == pytest.approx(
            truth[("web", "m-bad")][3][1]
        )
        assert [(s["step"], s["tool"], s["rule"], s["process"], s["judge"]) for s in shown["steps"]] == [
            (k, "bash", 0.5, 0.5, None) for k in range(STEPS)
        ]
        client.close()
    finally:
        second.proc.stop()

    expected = _expected_leaderboard(truth)
    assert len(board_before) == len(expected)
    for row in board_before:
        want = expected[(row["domain"], row["model"])]
        assert row["episodes"] == want["episodes"]
        assert row["success_rate"] == pytest.approx(want["success_rate"])
        assert row["mean_reward"] == pytest.approx(want["mean_reward"], abs=1e-9)
        assert row["ci95_low"] == pytest.approx(want["ci95"][0], abs=0.02)
        assert row["ci95_high"] == pytest.approx(want["ci95"][1], abs=0.02)
        if want["best"]:
            assert row["significant"] == "best"
        else:
            assert row["p_vs_best_welch"] == pytest.approx(want["p"], rel=1e-6)
            assert row["p_holm"] == pytest.approx(want["p_holm"], rel=1e-6)

    replay = start_sink(
        broker.bootstrap, clickhouse_url, tmp_path / "sink", "--from-beginning", name="replay"
    )
    try:
        wait_for(lambda: group_caught_up(broker.bootstrap), timeout_s=90, what="the replay to finish")
        client = reader(clickhouse_url)
        after = snapshot(client)
        board_after = _cli_leaderboard(clickhouse_url)
        client.close()
    finally:
        replay.proc.stop()
    assert f"'records': {len(events)}" in replay.proc.log_text()  # it really consumed everything again
    for table in before:
        assert after[table] == before[table], table
    assert board_after == board_before

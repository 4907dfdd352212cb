"""The judge role of `agentstream worker` (a real faust worker process) against the embedded broker
and the local Messages-API server, with the real anthropic SDK."""

from __future__ import annotations

import time

import pytest

from clients.kafka import ensure_topics
from schemas.topics import AGENT_EVENTS, DLQ, REWARD_JUDGE
from streams.judge.selection import sample_fraction
from tests.support.judge_events import trajectory
from tests.support.judge_servers.messages import MessagesServer
from tests.support.judge_worker import TopicReader
from tests.support.processes import AGENTSTREAM, Proc, wait_for
from tests.support.sink_harness import publish

pytestmark = pytest.mark.integration


def _produce(bootstrap: str, events, raw: list[bytes] = ()) -> None:
    publish(bootstrap, events, [(AGENT_EVENTS, b"bad", payload) for payload in raw])


def _worker(broker, tmp_path, server, rules_path, name, roles="judge", log_level="INFO", **extra_env):
    env = {
        "ANTHROPIC_API_KEY": "dummy-key",
        "AGENTSTREAM_JUDGE_BASE_URL": server.url,
        "AGENTSTREAM_JUDGE_BACKOFF_BASE_S": "0.05",
        **extra_env,
    }
    args = [*AGENTSTREAM, "worker", "--roles", roles, "--bootstrap-servers", broker.bootstrap]
    args += ["--data-dir", str(tmp_path / "data"), "--judge-rules", str(rules_path), "--log-level", log_level]
    return Proc(args, tmp_path / f"{name}.log", env)


def test_worker_scores_sampled_trajectories_only_and_sampling_is_stable_across_restarts(broker, tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: half\n    mode: step\n    rate: 0.5\n    batch_steps: 2\n")
    ensure_topics(broker.bootstrap)
    first = [f"w1-{n}" for n in range(8)]
    second = [f"w2-{n}" for n in range(8)]
    sampled = {t for t in first + second if sample_fraction(t) < 0.5}
    assert sampled & set(first) and sampled & set(second) and len(sampled) < 16

    with MessagesServer() as server:
        reader = TopicReader(broker.bootstrap, REWARD_JUDGE)
        dlq = TopicReader(broker.bootstrap, DLQ)
        _produce(
            broker.bootstrap, [e for t in first for e in trajectory(t, n=3, task=f"task {t}")], [b"\xff"]
        )
        worker = _worker(broker, tmp_path, server, rules, "worker1")
        try:
            want = 3 * len(sampled & set(first))
            wait_for(
                lambda: len(reader.poll()) >= want,
                90,
                what=f"{want} judge scores\n{worker.log_text()[-3000:]}",
            )
        finally:
            worker.stop()
        worker = _worker(broker, tmp_path, server, rules, "worker2")  # restarted worker, new trajectories
        try:
            _produce(broker.bootstrap, [e for t in second for e in trajectory(t, n=3, task=f"task {t}")])
            want = 3 * len(sampled)
            wait_for(
                lambda: len(reader.poll()) >= want,
                90,
                what=f"{want} judge scores\n{worker.log_text()[-3000:]}",
            )
            time.sleep(1.0)
            events = reader.poll()
            wait_for(lambda: any(e.stage == "judge" for e in dlq.poll()), 30, what="the judge's dead letter")
        finally:
            worker.stop()
            reader.close()
            dlq.close()

    scored = [e for e in events if e.type == "reward.judge.step"]
    assert {e.trajectory_id for e in scored} == sampled  # and nothing for the others
    assert len({e.event_id for e in scored}) == 3 * len(sampled)  # replays, if any, reuse ids
    for e in scored:
        assert e.scores and e.score is not None and e.rationale
        assert e.judge_model == "claude-sonnet-4-6" and e.prompt_version == "judge-v1"
        assert e.input_tokens > 0 and e.output_tokens > 0 and e.cost_usd > 0
    assert len(server.requests) <= 2 * len(sampled) + 2  # 3 steps in 2 calls per trajectory (+ replays)


def test_worker_group_mode_one_call_per_group_across_partitions(broker, tmp_path):
    """Members of a group sit in different partitions of agent.events; the worker re-keys them by
    group id, so each group is judged in one call: when its size is reached, or after the quiet
    period when the size is unknown."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: grpo\n    mode: group\n")
    ensure_topics(broker.bootstrap)
    sized = [f"gs-{n}" for n in range(3)]
    unsized = [f"gu-{n}" for n in range(2)]
    events = [e for t in sized for e in trajectory(t, group_id="sized", task="task S", group_size=3)]
    events += [e for t in unsized for e in trajectory(t, group_id="open", task="task O")]
    with MessagesServer() as server:
        reader = TopicReader(broker.bootstrap, REWARD_JUDGE)
        _produce(broker.bootstrap, events)
        worker = _worker(broker, tmp_path, server, rules, "worker", AGENTSTREAM_JUDGE_GROUP_WAIT_S="4")
        try:
            wait_for(lambda: len(reader.poll()) >= 5, 90, what=f"5 group scores\n{worker.log_text()[-3000:]}")
            time.sleep(1.0)
            scored = reader.poll()
        finally:
            worker.stop()
            reader.close()
    assert sorted(e.trajectory_id for e in scored) == sorted(sized + unsized)
    assert all(e.type == "reward.judge.trajectory" and e.mode == "group" for e in scored)
    assert {e.group_id for e in scored if e.trajectory_id in sized} == {"sized"}
    assert len(server.requests) == 2  # one call per group


def test_assembled_trajectories_carry_judge_scores_and_a_published_calibration(broker, tmp_path):
    """scoring + judge workers: scoring waits for the judge on selected trajectories, and after
    `calibration.updated` arrives its totals use the calibrated judge score and name the map's
    version."""
    from schemas.topics import TRAJECTORY_SCORED
    from streams.judge.calibration import calibration_event, fit_calibration
    from streams.judge.human import publish

    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: all\n    mode: trajectory\n")
    ensure_topics(broker.bootstrap)
    with MessagesServer(base_score=0.3) as server:
        reader = TopicReader(broker.bootstrap, TRAJECTORY_SCORED)
        worker = _worker(broker, tmp_path, server, rules, "worker", roles="scoring,judge")
        try:
            _produce(broker.bootstrap, trajectory("before", n=2, task="task one"))

            def scored(tid):
                return [e for e in reader.poll() if e.trajectory_id == tid and e.complete]

            before = wait_for(
                lambda: scored("before"), 120, what=f"'before' scored\n{worker.log_text()[-3000:]}"
            )
            fit = fit_calibration(
                [0.1, 0.3, 0.6, 0.9], [0.4, 0.7, 0.8, 1.0], domain="coding", rubric="overall"
            )
            publish(broker.bootstrap, [calibration_event(fit)])
            # scoring consumes feedback.human independently of agent.events: wait until it has the map
            wait_for(
                lambda: f"calibration {fit.map.version}" in worker.log_text(), 60, what="the map applied"
            )
            _produce(broker.bootstrap, trajectory("after", n=2, task="task two"))
            after = wait_for(
                lambda: scored("after"), 120, what=f"'after' scored\n{worker.log_text()[-3000:]}"
            )
        finally:
            worker.stop()
            reader.close()
    before, after = before[-1], after[-1]
    assert before.calibration_version is None and after.calibration_version == fit.map.version
    assert after.total_reward > before.total_reward


def test_worker_keeps_going_through_a_failing_endpoint(broker, tmp_path):
    """A permanently failing endpoint gives failure events (never scores) and opens the circuit; the
    worker keeps consuming, and scores again once the endpoint is back and the circuit half-opens."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: all\n    mode: trajectory\n")
    ensure_topics(broker.bootstrap)
    with MessagesServer() as server:
        server.fail_status = 500
        reader = TopicReader(broker.bootstrap, REWARD_JUDGE)
        env = {"AGENTSTREAM_JUDGE_MAX_ATTEMPTS": "2", "AGENTSTREAM_JUDGE_CIRCUIT_FAILURES": "2",
               "AGENTSTREAM_JUDGE_CIRCUIT_RESET_S": "2"}  # fmt: skip
        worker = _worker(broker, tmp_path, server, rules, "worker", **env)
        try:
            _produce(broker.bootstrap, [e for n in range(4) for e in trajectory(f"down-{n}", task=f"t{n}")])
            wait_for(lambda: len(reader.poll()) >= 4, 90, what=f"4 failures\n{worker.log_text()[-3000:]}")
            failures = list(reader.events)
            wait_for(lambda: "judge circuit open" in worker.log_text(), 30, what="the circuit to open")
            server.fail_status = None
            time.sleep(2.5)  # the circuit half-opens
            _produce(broker.bootstrap, trajectory("up", task="back again"))
            wait_for(
                lambda: any(e.trajectory_id == "up" for e in reader.poll()), 60, what="a score after recovery"
            )
            recovered = [e for e in reader.events if e.trajectory_id == "up"]
        finally:
            worker.stop()
            reader.close()
    assert all(e.type == "reward.judge.failed" for e in failures)
    assert "error" in {e.kind for e in failures} and {e.kind for e in failures} <= {"error", "circuit_open"}
    assert all("HTTP 500" in e.reason or e.kind == "circuit_open" for e in failures)
    assert [e.type for e in recovered] == ["reward.judge.trajectory"] and recovered[0].score is not None


def test_kill9_mid_batch_loses_no_score_and_replays_reuse_ids(broker, tmp_path):
    """kill -9 while calls are in flight: the restarted worker re-reads what was not committed and
    judges it again; every step gets a score, and a step judged twice has one event id."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: all\n    mode: step\n")
    ensure_topics(broker.bootstrap)
    tids = [f"k-{n}" for n in range(10)]
    with MessagesServer(latency_s=1.5) as server:
        reader = TopicReader(broker.bootstrap, REWARD_JUDGE)
        _produce(broker.bootstrap, [e for t in tids for e in trajectory(t, n=2, task=f"task {t}")])
        worker = _worker(broker, tmp_path, server, rules, "worker1", AGENTSTREAM_JUDGE_CONCURRENCY="4")
        try:
            wait_for(
                lambda: len(server.requests) >= 2, 90, what=f"calls in flight\n{worker.log_text()[-2000:]}"
            )
        finally:
            worker.kill9()
        server.latency_s = 0.0
        worker = _worker(broker, tmp_path, server, rules, "worker2")
        try:
            want = {(t, i) for t in tids for i in range(2)}

            def all_scored():
                return {(e.trajectory_id, e.step_index) for e in reader.poll()} >= want

            wait_for(all_scored, 90, what=f"every step scored\n{worker.log_text()[-2000:]}")
            time.sleep(1.0)
            events = reader.poll()
        finally:
            worker.stop()
            reader.close()
    by_target: dict = {}
    for e in events:
        assert e.type == "reward.judge.step"
        by_target.setdefault((e.trajectory_id, e.step_index), set()).add(e.event_id)
    assert len(by_target) == 20 and all(len(ids) == 1 for ids in by_target.values())

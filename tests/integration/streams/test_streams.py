"""Stream processors end to end: the embedded broker over TCP and a real `agentstream worker`
subprocess running the `scoring` role (rule rewards and trajectory assembly in one faust app).

One worker run covers: 200 interleaved trajectories, a kill -9 in the middle of the load and a
restart (tables recovered from their changelogs), out-of-order and duplicated input, a trajectory
that never ends (grace timeout), and bad input (malformed bytes, wrong schema, unknown type) in the
dead-letter topic."""

from __future__ import annotations

import random
import time
from collections import defaultdict

import pytest

from clients.kafka import ensure_topics
from schemas import topics
from schemas.codec import encode
from schemas.events import EpisodeStarted, RuleRewardStep, StepRecorded, TrajectoryScored
from streams.assembler.assembly import Assembly
from streams.assembler.reward_math import Calibrations
from streams.rules.profiles import ProfileRegistry
from streams.rules.rewards import StepInput, score_steps
from tests.support.processes import Proc, wait_for
from tests.support.streams_helpers import interleave, make_trajectory, publish, read_topic, worker_args

pytestmark = pytest.mark.integration

GRACE_S = 15
SESSION_TIMEOUT_S = 10
REGISTRY = ProfileRegistry()


def _expected_rewards(events) -> dict[str, RuleRewardStep]:
    """Pure rule rewards per source step event id."""
    started = next(e for e in events if isinstance(e, EpisodeStarted))
    steps = sorted((e for e in events if isinstance(e, StepRecorded)), key=lambda s: s.step_index)
    scores = score_steps(
        [StepInput(s.tool, s.params, s.observation) for s in steps], REGISTRY.get(started.domain)
    )
    return dict(zip([s.event_id for s in steps], scores, strict=True))


def _expected_scored(events, rewards) -> TrajectoryScored:
    a = Assembly()
    for e in [*events, *rewards]:
        a.add(e, now=0.0)
    out = a.decide(events[0].trajectory_id, REGISTRY, Calibrations(), now=0.0, grace_s=1e9)
    assert out is not None
    return out


def _unique_by_id(events):
    """event_id -> event, asserting that every copy of an id has identical content."""
    by_id = {}
    for e in events:
        if e.event_id in by_id:
            assert by_id[e.event_id].model_dump() == e.model_dump(), f"conflicting content for {e.event_id}"
        by_id[e.event_id] = e
    return by_id


def test_worker_rewards_and_assembles_through_a_crash(broker, tmp_path):
    rng = random.Random(42)
    ended = [make_trajectory(f"traj-{i:03d}", rng.randint(3, 8), rng) for i in range(200)]
    stream = interleave(ended, rng)
    # out of order: steps before episode.started, episode.ended before the last step
    ooo = make_trajectory("traj-ooo", 4, rng)
    ooo_events = [ooo[2], ooo[3], ooo[0], ooo[5], ooo[1], ooo[4]]
    never = make_trajectory("traj-never", 3, rng, ended=False)
    bad = [
        (b"bad-1", b"\xff\x00 not json"),
        (b"bad-2", encode(ooo[1]).replace(b'"step_index":0,', b"")),  # wrong schema: required field missing
        (b"bad-3", b'{"type": "step.teleported", "event_id": "x", "trajectory_id": "bad-3"}'),
    ]
    all_trajectories = [*ended, ooo, never]
    half = len(stream) // 2

    ensure_topics(
        broker.bootstrap
    )  # as `agentstream topics create` would (auto-created topics get 1 partition)
    data_dir = tmp_path / "worker"
    args = worker_args(broker.bootstrap, data_dir, "scoring", "--grace-seconds", str(GRACE_S))
    worker = Proc(args, tmp_path / "worker-1.log")
    try:
        publish(broker.bootstrap, topics.AGENT_EVENTS, stream[:half] + ooo_events[:3])
        wait_for(
            lambda: len(read_topic(broker.bootstrap, topics.REWARD_RULE)) > half // 3,
            120,
            what="first rewards",
        )
        time.sleep(2.5)  # let offsets and changelogs be committed for part of the load
        worker.kill9()
        # Restart once the dead members' 10 s sessions have expired, so this run starts from a settled
        # group; an immediate restart (new members joining while the dead ones are still in the group)
        # is what tests/system/test_faults.py does, where the supervisor restarts the worker at once.
        time.sleep(SESSION_TIMEOUT_S + 2)
        worker = Proc(args, tmp_path / "worker-2.log")
        publish(broker.bootstrap, topics.AGENT_EVENTS, stream[half:] + ooo_events[3:] + never, raw=bad)
        publish(broker.bootstrap, topics.AGENT_EVENTS, rng.sample(stream, 50))  # duplicates

        n_steps = sum(isinstance(e, StepRecorded) for t in all_trajectories for e in t)
        n_scored = len(ended) + 2

        def done():
            rewards = {e.event_id for e in read_topic(broker.bootstrap, topics.REWARD_RULE)}
            scored = {e.trajectory_id for e in read_topic(broker.bootstrap, topics.TRAJECTORY_SCORED)}
            return len(rewards) >= n_steps and len(scored) >= n_scored

        wait_for(done, 150, interval_s=1.0, what=f"{n_steps} rewards and {n_scored} scored trajectories")
        time.sleep(2)  # anything extra (a second revision) would show up now
    finally:
        worker.stop()

    rewards = _unique_by_id(read_topic(broker.bootstrap, topics.REWARD_RULE))
    scored = _unique_by_id(read_topic(broker.bootstrap, topics.TRAJECTORY_SCORED))
    dead = read_topic(broker.bootstrap, topics.DLQ)

    # every step exactly one rule reward, equal to the pure functions
    by_source = defaultdict(list)
    for r in rewards.values():
        by_source[r.source_event_id].append(r)
    for traj in all_trajectories:
        for source_id, s in _expected_rewards(traj).items():
            (r,) = by_source.pop(source_id)
            assert (r.redundancy, r.regression, r.info_utilization, r.score) == (
                s.redundancy,
                s.regression,
                s.info_utilization,
                s.score,
            )
    assert not by_source

    # every trajectory one trajectory.scored, with the totals of the pure assembler (same id, same bytes)
    per_traj = defaultdict(list)
    for t in scored.values():
        per_traj[t.trajectory_id].append(t)
    rewards_by_traj = defaultdict(list)
    for r in rewards.values():
        rewards_by_traj[r.trajectory_id].append(r)
    for traj in [*ended, ooo]:
        (got,) = per_traj.pop(traj[0].trajectory_id)
        expected = _expected_scored(traj, rewards_by_traj[traj[0].trajectory_id])
        assert got.complete and got.revision == 0
        assert got.model_dump() == expected.model_dump()
    (never_scored,) = per_traj.pop("traj-never")
    assert not never_scored.complete and never_scored.missing == ["episode.ended"]
    assert [s.rule_score is not None for s in never_scored.steps] == [True] * 3
    assert not per_traj

    # bad input: one dead letter, from the one stage that read it, with the reason
    reasons = defaultdict(set)
    for d in dead:
        reasons[d.source_key].add((d.stage, d.reason))
    assert {stage for stage, _ in reasons["bad-1"]} == {"scoring"}
    assert all("not valid JSON" in reason for _, reason in reasons["bad-1"])
    assert all("step_index" in reason for _, reason in reasons["bad-2"]) and reasons["bad-2"]
    assert all("step.teleported" in reason for _, reason in reasons["bad-3"]) and reasons["bad-3"]
    assert all(d.source_topic == topics.AGENT_EVENTS and d.source_offset is not None for d in dead)

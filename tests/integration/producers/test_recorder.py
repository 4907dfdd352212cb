"""AgentRecorder: episode events, failure paths, buffer policy, flush semantics (no broker needed),
and the SDK/async/policy round trips against the embedded broker."""

from __future__ import annotations

import asyncio

import pytest

from producers.errors import EpisodeStateError, ProducerError, RecorderBufferFull
from producers.sdk.pipeline import EventBuffer
from producers.sdk.recorder import AgentRecorder, AsyncAgentRecorder
from producers.sdk.spool import decode_body, scan_frames
from schemas.ids import derived_event_id
from schemas.topics import AGENT_EVENTS, POLICY_UPDATES
from tests.support.processes import free_port
from tests.support.readback import read_topic


def spooled_events(data_dir) -> list[dict]:
    """Decode every record in the spool files (read directly: the recorder may still hold the lock)."""
    import orjson

    out = []
    for segment in sorted((data_dir / "spool").glob("*/*.seg")):
        out += [
            orjson.loads(decode_body(body).value) for _, _, body in scan_frames(segment.read_bytes()) if body
        ]
    return out


@pytest.fixture
def offline_recorder(data_dir):
    """A recorder whose broker address has nothing listening: everything stays in the spool."""
    rec = AgentRecorder(
        f"127.0.0.1:{free_port()}", data_dir, agent="agent-x", model="model-y", policy_version="v1",
        connect_timeout_ms=300, close_timeout_s=1,
    )  # fmt: skip
    yield rec
    rec.close(1)


def test_episode_events_have_indexes_utc_times_and_deterministic_ids(offline_recorder, data_dir):
    rec = offline_recorder
    with rec.episode(task_id="t1", task="fix it", domain="coding", group_id="g", metadata={"k": 1}) as ep:
        for i in range(3):
            ep.step(
                thought=f"t{i}", tool="bash", params={"cmd": "ls"}, observation={"files": [i]}, exit_code=0,
                input_tokens=10, output_tokens=5, latency_ms=1.5, token_ids=[1, 2], logprobs=[-0.1, -0.2],
            )  # fmt: skip
        ep.end(success=True, score=0.75, tests_passed=3, tests_failed=0)
    assert rec.flush(5, until="spooled")
    events = spooled_events(data_dir)
    assert [e["type"] for e in events] == ["episode.started", *["step.recorded"] * 3, "episode.ended"]
    traj = ep.trajectory_id
    assert {e["trajectory_id"] for e in events} == {traj}
    started, steps, ended = events[0], events[1:4], events[4]
    assert (started["agent"], started["model"], started["policy_version"], started["group_id"]) == (
        "agent-x", "model-y", "v1", "g",
    )  # fmt: skip
    assert [s["step_index"] for s in steps] == [0, 1, 2]
    assert [s["event_id"] for s in steps] == [derived_event_id("step.recorded", traj, i) for i in range(3)]
    assert steps[1]["observation"] == '{"files":[1]}' and steps[1]["logprobs"] == [-0.1, -0.2]
    assert steps[0]["model"] == "model-y" and steps[0]["policy_version"] == "v1"
    assert all(e["occurred_at"].endswith("Z") for e in events)
    assert ended["success"] is True and ended["total_steps"] == 3 and ended["score"] == 0.75
    assert ended["event_id"] == derived_event_id("episode.ended", traj)


def test_exception_ends_the_episode_as_failed_and_propagates(offline_recorder, data_dir):
    with pytest.raises(KeyError, match="missing"), offline_recorder.episode(task_id="t") as ep:
        ep.step(tool="bash")
        raise KeyError("missing")
    assert offline_recorder.flush(5, until="spooled")
    ended = spooled_events(data_dir)[-1]
    assert ended["type"] == "episode.ended" and ended["trajectory_id"] == ep.trajectory_id
    assert ended["success"] is False and ended["error"] == "KeyError: 'missing'" and ended["total_steps"] == 1


def test_leaving_the_block_without_end_records_a_truncated_episode(offline_recorder, data_dir):
    with offline_recorder.episode(task_id="t") as ep:
        ep.step(tool="bash")
    offline_recorder.flush(5, until="spooled")
    ended = spooled_events(data_dir)[-1]
    assert (ended["success"], ended["terminated"], ended["truncated"]) == (False, False, True)


def test_misuse_and_bad_fields_raise_errors_naming_them(offline_recorder):
    ep = offline_recorder.episode(task_id="t")
    with pytest.raises(ProducerError, match=r"input_tokens: .*greater than or equal to 0.*-3"):
        ep.step(input_tokens=-3)
    with pytest.raises(ProducerError, match=r"score: .*less than or equal to 1.*1\.5"):
        offline_recorder.episode(task_id="t2").end(success=True, score=1.5)
    ep.end(success=True)
    with pytest.raises(EpisodeStateError, match="step\\(\\) after the episode ended"):
        ep.step(tool="x")
    with pytest.raises(EpisodeStateError, match="end\\(\\) called twice"):
        ep.end(success=True)
    with pytest.raises(ProducerError, match="unknown AgentRecorder option"):
        AgentRecorder("127.0.0.1:1", "/nonexistent", buffer_sise=3)


def test_flush_distinguishes_spooled_from_delivered(offline_recorder):
    with offline_recorder.episode(task_id="t") as ep:
        ep.step(tool="bash")
        ep.end(success=True)
    assert offline_recorder.flush(5, until="spooled") is True
    assert offline_recorder.flush(0.3) is False  # nobody acknowledged: the broker is down
    assert offline_recorder.pending == 3


def test_full_buffer_raises_or_blocks_then_raises_naming_the_size():
    buffer = EventBuffer(2)
    buffer.put("a", "raise")
    buffer.put("b", "raise")
    with pytest.raises(RecorderBufferFull, match="buffer_size=2"):
        buffer.put("c", "raise")
    with pytest.raises(RecorderBufferFull, match=r"buffer_size=2 .* after waiting 0\.1"):
        buffer.put("c", "block", timeout_s=0.1)
    assert buffer.take(10, 0) == ["a", "b"]
    assert buffer.put("c", "block", timeout_s=0.1) == 3


# --- against the embedded broker ---------------------------------------------------------------------


def by_trajectory(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: (r["partition"], r["offset"])):
        out.setdefault(r["value"]["trajectory_id"], []).append(r)
    return out


@pytest.mark.integration
def test_sdk_round_trip_and_failed_episode(broker, data_dir):
    rec = AgentRecorder(broker.bootstrap, data_dir, agent="a", model="m", policy_version="v1")
    n = 25
    with rec.episode(task_id="ok", task="do it") as good:
        for i in range(n):
            good.step(thought=f"step {i}", tool="bash", observation="x" * 2048, exit_code=0)
        good.end(success=True, score=1.0)
    with pytest.raises(RuntimeError), rec.episode(task_id="bad") as bad:
        bad.step(tool="bash", exit_code=1)
        raise RuntimeError("tool crashed")
    assert rec.flush(30) is True
    assert rec.close() is True
    trajectories = by_trajectory(read_topic(broker.bootstrap, AGENT_EVENTS, min_records=n + 5))
    events = trajectories[good.trajectory_id]
    assert [e["value"]["type"] for e in events] == [
        "episode.started",
        *["step.recorded"] * n,
        "episode.ended",
    ]
    assert [e["value"]["step_index"] for e in events[1:-1]] == list(range(n))
    assert {e["key"] for e in events} == {good.trajectory_id.encode()}
    assert len({e["partition"] for e in events}) == 1
    failed = [e["value"] for e in trajectories[bad.trajectory_id]]
    assert failed[-1]["success"] is False and failed[-1]["error"] == "RuntimeError: tool crashed"


@pytest.mark.integration
def test_async_recorder_round_trip(broker, data_dir):
    async def main():
        async with AsyncAgentRecorder(broker.bootstrap, data_dir, agent="async-agent") as rec:
            async with rec.episode(task_id="t", domain="search") as ep:
                for i in range(5):
                    await ep.step(tool="search", params={"q": str(i)}, observation=f"r{i}")
                await ep.end(success=True)
            with pytest.raises(ValueError):
                async with rec.episode(task_id="t2") as failing:
                    raise ValueError("nope")
            assert await rec.flush(30)
        return ep.trajectory_id, failing.trajectory_id

    good, bad = asyncio.run(main())
    trajectories = by_trajectory(read_topic(broker.bootstrap, AGENT_EVENTS, min_records=9))
    assert [e["value"]["type"] for e in trajectories[good]][-1] == "episode.ended"
    assert [e["value"].get("step_index") for e in trajectories[good]][1:-1] == [0, 1, 2, 3, 4]
    assert trajectories[bad][-1]["value"]["error"] == "ValueError: nope"


@pytest.mark.integration
def test_follow_policy_stamps_new_episodes_with_the_latest_policy(broker, data_dir):
    from kafka import KafkaProducer

    from clients.kafka import ensure_topics
    from schemas.codec import encode
    from schemas.events import PolicyUpdated, utc_now
    from schemas.topics import TOPICS

    ensure_topics(broker.bootstrap, [TOPICS[POLICY_UPDATES]])
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for version in ("p1", "p2"):
        event = PolicyUpdated(event_id=version, trajectory_id=version, occurred_at=utc_now(), producer="test",
                              policy_version=version)  # fmt: skip
        producer.send(POLICY_UPDATES, key=version.encode(), value=encode(event)).get(10)
    producer.close()
    rec = AgentRecorder(broker.bootstrap, data_dir, policy_version="v0", follow_policy=True, policy_ttl_s=0)
    with rec.episode(task_id="t") as ep:
        step = ep.step(tool="x")
        ep.end(success=True)
    rec.close()
    assert step.policy_version == "p2"
    started = by_trajectory(read_topic(broker.bootstrap, AGENT_EVENTS, min_records=3))[ep.trajectory_id][0]
    assert started["value"]["policy_version"] == "p2"


def test_oversize_events_are_refused_when_recorded(offline_recorder):
    ep = offline_recorder.episode(task_id="t")
    with pytest.raises(ProducerError, match=r"step.recorded .* exceeds max_event_bytes=1000000"):
        ep.step(observation="x" * 500_001, thought="y" * 500_001)  # each string within its own limit
    with pytest.raises(ProducerError, match=r"observation: .* at most 512000 characters"):
        ep.step(observation="x" * 1_000_001)
    deep: object = 1
    for _ in range(300):
        deep = [deep]
    with pytest.raises(ProducerError, match=r"params: nests at least 65 levels .* limit of 64"):
        ep.step(tool="x", params={"x": deep})
    assert ep.step(tool="ok").step_index == 0  # the refused step did not use up an index


def test_an_event_not_accepted_can_be_retried_with_the_same_index():
    from producers.sdk.episode import EpisodeIdentity, EpisodeLog
    from producers.sdk.recorder import _publish_or_retract

    log = EpisodeLog(EpisodeIdentity("traj", "task"), producer="p")

    def full(event):
        raise RecorderBufferFull(1)

    with pytest.raises(RecorderBufferFull):
        _publish_or_retract(full, log, log.step(tool="a"))
    accepted = []
    _publish_or_retract(accepted.append, log, log.step(tool="a"))
    with pytest.raises(RecorderBufferFull):
        _publish_or_retract(full, log, log.ended(success=True))
    _publish_or_retract(accepted.append, log, log.ended(success=True))
    assert [e.type for e in accepted] == ["step.recorded", "episode.ended"]
    assert accepted[0].step_index == 0 and accepted[1].total_steps == 1

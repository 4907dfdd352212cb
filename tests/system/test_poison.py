"""Acceptance (#34, "no poison pill anywhere"): poison records written straight onto `agent.events`,
`reward.judge`, `trajectory.scored` and `training.batches` (a raw producer, bypassing every check)
leave every stage of a real stack running (scoring, sink, trainer, the executor following batches:
no exit, no restart); each record is dead-lettered with its topic, partition and offset by every
stage that cannot use it; and a good episode published after them reaches ClickHouse.

One stack (`agentstream up`'s supervisor) for every shape: garbage bytes, invalid UTF-8, JSON nested
300 levels deep, `step_index` 2**32, `total_steps` 10**8, wrong-typed fields (deep in `steps` too),
a 900 KB string, a `batch.built` pointing to a missing file and one pointing to garbage.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from schemas import EpisodeEnded, EpisodeStarted, StepRecorded, encode, topics, utc_now
from schemas.codec import decode
from schemas.events import BatchBuilt, JudgeStep, ScoredStep, TrajectoryScored
from tests.support.processes import wait_for
from tests.support.stack import running_stack

AT = "2026-01-01T00:00:00Z"
DEEP = b"[" * 300 + b"]" * 300
# Which stages read each topic (the DLQ's `stage`): each must dead-letter what it cannot decode.
READERS = {
    topics.AGENT_EVENTS: {"scoring", "sink"},
    topics.REWARD_JUDGE: {"scoring", "sink"},
    topics.TRAJECTORY_SCORED: {"trainer", "sink"},
    topics.TRAINING_BATCHES: {"executor", "sink"},
}


def _valid(model, **fields) -> dict:
    """A valid event of `model` as a plain dict, to be spoiled in one place."""
    common = {
        "event_id": f"p-{model.__name__}",
        "trajectory_id": "poison",
        "occurred_at": AT,
        "producer": "p",
    }
    return orjson.loads(encode(model(**{**common, **fields})))


def _spoiled(event: dict, **fields) -> bytes:
    """`event` with `fields` replaced; the value "DEEP" becomes 300 nested lists (orjson cannot even
    write those, so they are spliced into the bytes)."""
    return orjson.dumps({**event, **fields}).replace(b'"DEEP"', DEEP)


def _shapes(tmp: Path) -> list[tuple[str, str, bytes, set[str]]]:
    """(name, topic, value, stages that must dead-letter it even where the contract accepts it)."""
    garbage_file = tmp / "garbage.jsonl"
    garbage_file.write_bytes(b"\xff\x00 not json\n")
    step = _valid(StepRecorded, step_index=0)
    ended = _valid(EpisodeEnded, success=True, total_steps=1)
    judge = _valid(JudgeStep, step_index=0, score=0.5, judge_model="m", prompt_version="p")
    scored = _valid(
        TrajectoryScored, task_id="k", domain="coding", steps=[ScoredStep(step_index=0)], total_steps=1
    )
    batch = _valid(BatchBuilt, batch_id="p-batch", kind="grpo", path=str(tmp / "none.jsonl"), row_count=1)
    scored_step = scored["steps"][0]
    shapes = []
    for topic in READERS:
        shapes += [
            ("garbage", topic, b"\x00\xff\xfe garbage", set()),
            ("invalid utf-8", topic, b'{"type":"step.recorded","trajectory_id":"\xff\xfe"}', set()),
        ]
    shapes += [
        ("deep params", topics.AGENT_EVENTS, _spoiled(step, params={"a": "DEEP"}), {"sink"}),
        ("step_index 2**32", topics.AGENT_EVENTS, _spoiled(step, step_index=2**32), {"sink"}),
        ("total_steps 1e8", topics.AGENT_EVENTS, _spoiled(ended, total_steps=10**8), set()),
        ("wrong type", topics.AGENT_EVENTS, _spoiled(step, step_index="three"), set()),
        ("900 KB string", topics.AGENT_EVENTS, _spoiled(step, thought="x" * 900_000), set()),
        ("deep scores", topics.REWARD_JUDGE, _spoiled(judge, scores={"a": "DEEP"}), set()),
        ("judge step_index 2**32", topics.REWARD_JUDGE, _spoiled(judge, step_index=2**32), set()),
        ("wrong type", topics.REWARD_JUDGE, _spoiled(judge, score="high"), set()),
        ("deep step params", topics.TRAJECTORY_SCORED,
         _spoiled(scored, steps=[{**scored_step, "params": {"a": "DEEP"}}]), {"sink"}),
        ("wrong type deep in steps", topics.TRAJECTORY_SCORED,
         _spoiled(scored, steps=[{**scored_step, "judge_scores": "x"}]), set()),
        ("total_steps 1e8", topics.TRAJECTORY_SCORED, _spoiled(scored, total_steps=10**8), set()),
        ("900 KB string", topics.TRAJECTORY_SCORED, _spoiled(scored, task="x" * 900_000), set()),
        ("deep builder_config", topics.TRAINING_BATCHES, _spoiled(batch, builder_config={"a": "DEEP"}),
         {"executor"}),
        ("missing batch file", topics.TRAINING_BATCHES, _spoiled(batch), {"executor"}),
        ("garbage batch file", topics.TRAINING_BATCHES,
         _spoiled(batch, event_id="p-batch-2", batch_id="p-batch-2", path=str(garbage_file)), {"executor"}),
        ("wrong type", topics.TRAINING_BATCHES, _spoiled(batch, row_count="many"), set()),
    ]  # fmt: skip
    return shapes


def _refused_by_contract(value: bytes) -> bool:
    try:
        decode(value)
    except Exception:
        return True
    return False


def _good_episode(tid: str) -> list:
    common = {"trajectory_id": tid, "producer": "good", "occurred_at": utc_now()}
    return [
        EpisodeStarted(event_id=f"{tid}-s", task_id="task", domain="coding", **common),
        StepRecorded(event_id=f"{tid}-0", step_index=0, tool="bash", params={"command": "ls"}, **common),
        StepRecorded(event_id=f"{tid}-1", step_index=1, tool="bash", params={"command": "pytest"}, **common),
        EpisodeEnded(event_id=f"{tid}-e", success=True, total_steps=2, **common),
    ]


@pytest.mark.timeout(240)
def test_poison_on_every_topic_leaves_every_stage_running_and_the_next_episode_lands(tmp_path):
    with running_stack(tmp_path / "stack", train=True) as (config, supervisor):
        _poison_then_a_good_episode(config, supervisor, tmp_path)


def _poison_then_a_good_episode(config, supervisor, tmp_path: Path) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=config.bootstrap_servers, acks="all", max_request_size=4_000_000
    )
    try:
        written = []  # (name, topic, partition, offset, stages that must dead-letter it)
        for name, topic, value, stages in _shapes(tmp_path):
            meta = producer.send(topic, key=f"poison-{len(written)}".encode(), value=value).get(timeout=30)
            required = READERS[topic] if _refused_by_contract(value) else stages
            written.append((name, topic, meta.partition, meta.offset, required))
        for event in _good_episode("good-after-poison"):
            producer.send(topics.AGENT_EVENTS, key=event.trajectory_id.encode(), value=encode(event))
        producer.flush(30)

        def landed():
            steps = config.query(
                "SELECT count() FROM agentstream.steps FINAL WHERE trajectory_id = 'good-after-poison'"
            )
            scored = config.query(
                "SELECT complete FROM agentstream.trajectories FINAL "
                "WHERE trajectory_id = 'good-after-poison'"
            )
            return steps == [(2,)] and scored == [(1,)]

        wait_for(landed, timeout_s=90, interval_s=0.5, what="the good episode in steps and trajectories")

        def lettered():
            rows = config.query(
                "SELECT source_topic, source_partition, source_offset, groupUniqArray(stage) "
                "FROM agentstream.dead_letters GROUP BY source_topic, source_partition, source_offset"
            )
            found = {(t, p, o): set(stages) for t, p, o, stages in rows}
            short = [(n, t, p, o, need - found.get((t, p, o), set())) for n, t, p, o, need in written
                     if not need <= found.get((t, p, o), set())]  # fmt: skip
            return short or None

        deadline = time.monotonic() + 60
        while (short := lettered()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not short, f"not dead-lettered (shape, topic, partition, offset, stages missing): {short}"
        for name, entry in supervisor.running.items():
            assert entry.restarts == 0 and entry.popen is not None and entry.popen.poll() is None, (
                name,
                entry.restarts,
                entry.last_exit,
                (config.data_dir / "logs" / f"{name}.log").read_text()[-3000:]
                if (config.data_dir / "logs" / f"{name}.log").exists()
                else "",
            )
    finally:
        producer.close()

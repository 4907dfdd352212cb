"""Evaluation never trains (schema 1.5): every batch kind leaves out trajectories whose `purpose` is not
"train" (or unknown: no episode.started), counts them in the batch's builder_config, withdraws an
earlier revision still pending, and holds no offset back for them. The assembler carries the purpose
from episode.started; the sink writes it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from consumers.batching.builders.groups import GroupConfig
from consumers.batching.builders.grpo import GRPOGroupConfig
from consumers.batching.builders.sft import SFTBuilderConfig
from consumers.batching.config import PlannerConfig
from consumers.batching.planner import Planner
from consumers.sink.rows import COLUMNS, episode_ended_row, episode_started_row, trajectory_row
from schemas.events import SCHEMA_VERSION, EpisodeEnded, EpisodeStarted, TrajectoryScored
from schemas.records import Record
from tests.support.trainer_data import golden_group

TOPIC = "trajectory.scored"


def planner(kinds) -> Planner:
    return Planner(
        PlannerConfig(
            kinds=kinds, batch_trajectories=100, flush_interval_s=100, grpo=GRPOGroupConfig(retokenize=True),
            sft=SFTBuilderConfig(require_success=False),
            groups=GroupConfig(group_size=4, min_group_size=2, timeout_s=300),
        )
    )  # fmt: skip


def as_eval(t: TrajectoryScored, suffix: str = "-eval") -> TrajectoryScored:
    return t.model_copy(update={"purpose": "eval", "trajectory_id": t.trajectory_id + suffix})


@pytest.mark.parametrize("kind", ["sft", "dpo", "dpo_step", "grpo"])
def test_every_kind_builds_from_train_episodes_only_and_counts_the_rest(kind):
    train = golden_group("task-a")
    evals = [as_eval(t) for t in golden_group("task-a")]
    p = planner((kind,))
    for i, t in enumerate(evals + train):
        p.offer(t, Record(TOPIC, 0, i), now=0.0)
    [batch] = p.due(now=0, force=True)
    ids = {e.trajectory.trajectory_id for e in batch.entries}
    assert ids == {t.trajectory_id for t in train}  # the same task: would have joined the group
    assert not any(r.get("trajectory_id", "").endswith("-eval") for r in batch.rows)
    assert batch.builder_config["left_out_by_purpose"] == len(evals)
    assert p.left_out_by_purpose == len(evals)
    # the eval trajectories hold no offset back
    assert p.commit_positions({(TOPIC, 0): 8}) == {(TOPIC, 0): 8}


def test_eval_episodes_alone_make_no_batch_and_train_ones_do():
    p = planner(("grpo", "sft"))
    for i, t in enumerate(as_eval(t) for t in golden_group()):
        p.offer(t, Record(TOPIC, 0, i), now=0.0)
    assert p.due(now=0, force=True) == []
    for i, t in enumerate(golden_group()):
        p.offer(t, Record(TOPIC, 0, 10 + i), now=0.0)
    batches = p.due(now=0, force=True)
    assert sorted(b.kind for b in batches) == ["grpo", "sft"]
    assert all(b.builder_config["left_out_by_purpose"] == 4 for b in batches)


def test_a_later_eval_revision_withdraws_the_pending_train_one_and_unknown_purpose_is_left_out():
    p = planner(("sft",))
    first = golden_group()[0]
    p.offer(first, Record(TOPIC, 0, 0), now=0.0)
    later = first.model_copy(update={"purpose": "eval", "revision": 1})
    p.offer(later, Record(TOPIC, 0, 1), now=0.0)
    no_start = golden_group()[1].model_copy(update={"missing": ["episode.started"]})
    p.offer(no_start, Record(TOPIC, 0, 2), now=0.0)
    assert p.due(now=0, force=True) == []
    assert p.left_out_by_purpose == 2
    assert p.commit_positions({(TOPIC, 0): 3}) == {(TOPIC, 0): 3}


def test_purpose_is_in_the_contract_and_refused_when_unknown():
    at = datetime(2026, 1, 1, tzinfo=UTC)
    assert SCHEMA_VERSION.endswith(".5")
    started = EpisodeStarted(event_id="s", trajectory_id="t", occurred_at=at, producer="p", task_id="k")
    assert started.purpose == "train"
    with pytest.raises(ValueError, match="purpose"):
        EpisodeStarted(
            event_id="s", trajectory_id="t", occurred_at=at, producer="p", task_id="k", purpose="test"
        )
    # written before 1.5: no purpose, read as train
    old = TrajectoryScored.model_validate_json(
        '{"event_id":"e","type":"trajectory.scored","schema_version":"1.4","trajectory_id":"t",'
        '"occurred_at":"2026-01-01T00:00:00Z","producer":"assembler","task_id":"k"}'
    )
    assert old.purpose == "train"


def test_the_sink_writes_purpose_from_the_start_half_and_the_scored_trajectory():
    at = datetime(2026, 1, 1, tzinfo=UTC)
    started = EpisodeStarted(
        event_id="s", trajectory_id="t", occurred_at=at, producer="p", task_id="k", purpose="eval"
    )
    ended = EpisodeEnded(event_id="x", trajectory_id="t", occurred_at=at, producer="p", success=True)
    column = COLUMNS["episodes"].index("purpose")
    assert episode_started_row(started)[column] == "eval"
    assert episode_ended_row(ended)[column] is None  # the ended half leaves it to the started half
    assert episode_ended_row(ended)[COLUMNS["episodes"].index("success")] == 1
    assert episode_started_row(started)[COLUMNS["episodes"].index("success")] is None
    scored = as_eval(golden_group()[0])
    assert trajectory_row(scored)[COLUMNS["trajectories"].index("purpose")] == "eval"


@pytest.mark.parametrize("purpose", ["eval", "train"])
def test_the_assembler_carries_the_purpose_through_its_stored_state(purpose):
    import json

    from streams.assembler.assembly import Assembly
    from streams.assembler.reward_math import Calibrations
    from tests.support.streams_events import REG, trajectory

    started, steps, ended, rewards = trajectory()
    started = started.model_copy(update={"purpose": purpose})
    a = Assembly()
    for e in [started, *steps, *rewards, ended]:
        a.add(e, 0.0)
        a = Assembly.from_dict(json.loads(json.dumps(a.to_dict())))  # the changelog round trip
    scored = a.decide("t", REG, Calibrations(), 0.0, 30.0)
    assert scored is not None and scored.purpose == purpose


def test_the_sdk_stamps_the_recorders_purpose_and_refuses_an_unknown_one(tmp_path):
    from producers.errors import ProducerError
    from producers.sdk.episode import EpisodeIdentity, EpisodeLog
    from producers.sdk.recorder import AgentRecorder

    assert EpisodeLog(EpisodeIdentity("t", "k", purpose="eval"), "sdk").started().purpose == "eval"
    assert EpisodeLog(EpisodeIdentity("t", "k"), "sdk").started().purpose == "train"
    with pytest.raises(ProducerError, match="purpose='test'"):
        AgentRecorder("127.0.0.1:1", tmp_path, purpose="test")

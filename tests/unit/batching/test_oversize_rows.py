"""A row too large for any `batch.rows` event: its trajectory (a grouped kind: its whole group) is left
out of the batch and dead-lettered with its source coordinates, and the rest of the batch is published;
a restart on the same input makes progress instead of failing on the same batch again."""

from __future__ import annotations

from typing import Any

import pytest

from consumers.batching.batch_writer import BatchStore, batch_id_for
from consumers.batching.builders.groups import GroupConfig
from consumers.batching.builders.grpo import GRPOGroupConfig
from consumers.batching.builders.sft import SFTBuilderConfig
from consumers.batching.config import BatchBuilderConfig, PlannerConfig
from consumers.batching.consumer import BatchBuilder, leave_out_oversize
from consumers.batching.planner import Planner
from consumers.batching.row_chunks import MAX_ROW_BYTES, canonical_lines, oversize_rows, row_trajectory_ids
from consumers.errors import TrainerError
from schemas import topics
from schemas.codec import decode, encode
from schemas.events import TrajectoryScored
from schemas.limits import MAX_EVENT_BYTES
from schemas.records import Record
from tests.support.trainer_data import scored, step

TOPIC = topics.TRAJECTORY_SCORED
# a tool call's arguments are JSON inside the row's JSON: every quote takes 4 bytes there, 2 in the event
QUOTES = 300_000


def group(task: str, big: int | None = None) -> list[TrajectoryScored]:
    """Four rollouts of `task`; member `big` called a tool with arguments no batch.rows event can carry."""
    return [
        scored(
            f"{task}-{i}",
            task,
            i / 4,
            [step("look", "bash", "ok", 0.5, cmd='"' * QUOTES if i == big else f"ls {i}")],
            success=True,
            group_id="g",
        )
        for i in range(4)
    ]


def planner(kinds: tuple[str, ...]) -> Planner:
    return Planner(
        PlannerConfig(
            kinds=kinds, batch_trajectories=100, flush_interval_s=100, grpo=GRPOGroupConfig(retokenize=True),
            sft=SFTBuilderConfig(require_success=False),
            groups=GroupConfig(group_size=4, min_group_size=2, timeout_s=300),
        )
    )  # fmt: skip


def offered(kind: str, trajectories: list[TrajectoryScored]):
    p = planner((kind,))
    for i, t in enumerate(trajectories):
        p.offer(t, Record(TOPIC, i % 3, 100 + i), now=0.0)
    [batch] = p.due(now=0, force=True)
    return batch


def test_the_poison_fits_in_its_own_event_but_its_row_does_not():
    [big] = [t for t in group("task-a", big=2) if t.trajectory_id == "task-a-2"]
    assert len(encode(big)) < MAX_EVENT_BYTES  # the broker took it: only its row is too large
    batch = offered("sft", [big])
    assert list(oversize_rows(batch.rows)) == [0]
    assert len(canonical_lines(batch.rows)[0]) > MAX_ROW_BYTES
    assert row_trajectory_ids(batch.rows[0]) == {"task-a-2"}


def test_sft_leaves_out_the_trajectory_and_dead_letters_it_with_its_coordinates():
    trajectories = group("task-a", big=2)
    batch = offered("sft", trajectories)
    planned = batch_id_for("sft", [t.trajectory_id for t in trajectories])
    kept, [letter] = leave_out_oversize(batch)
    ids = ["task-a-0", "task-a-1", "task-a-3"]
    assert [e.trajectory.trajectory_id for e in kept.entries] == ids
    assert sorted(r["trajectory_id"] for r in kept.rows) == ids
    assert kept.builder_config["left_out_by_row_size"] == 1
    assert (letter.stage, letter.source_topic, letter.source_partition, letter.source_offset) == (
        "trainer", TOPIC, 2, 102,
    )  # fmt: skip
    assert (letter.trajectory_id, letter.source_key, letter.error_type) == (
        "task-a-2",
        "task-a-2",
        "RowTooLarge",
    )
    size = oversize_rows(batch.rows)[[r["trajectory_id"] for r in batch.rows].index("task-a-2")]
    assert f"batch {planned} (sft): row " in letter.reason
    assert f"(trajectory task-a-2) takes {size} bytes as JSON, over the {MAX_ROW_BYTES}" in letter.reason
    assert f"published as batch {batch_id_for('sft', ids)}" in letter.reason
    assert len(encode(letter)) < MAX_EVENT_BYTES  # the letter itself travels


def test_grpo_leaves_out_the_whole_group_and_keeps_the_others():
    batch = offered("grpo", group("task-a", big=1) + group("task-b"))
    assert batch.extra["groups"] == 2
    kept, letters = leave_out_oversize(batch)
    assert {e.trajectory.trajectory_id for e in kept.entries} == {f"task-b-{i}" for i in range(4)}
    assert {r["trajectory_id"] for r in kept.rows} == {f"task-b-{i}" for i in range(4)}
    assert (kept.extra["groups"], kept.extra["incomplete_groups"], kept.extra["left_out_by_row_size"]) == (
        1,
        0,
        4,
    )
    assert [g.key for g in kept.groups] == [("task-b", "g")]
    assert sorted(d.trajectory_id for d in letters) == [f"task-a-{i}" for i in range(4)]
    assert all("(trajectory task-a-1) takes" in d.reason and "its group of 4" in d.reason for d in letters)
    assert len({d.event_id for d in letters}) == 4  # one per source record
    assert not oversize_rows(kept.rows)


def test_a_batch_with_no_oversize_row_is_untouched_and_one_with_nothing_else_is_gone():
    batch = offered("dpo", group("task-b"))
    assert leave_out_oversize(batch) == (batch, [])
    kept, letters = leave_out_oversize(offered("dpo", group("task-a", big=0)))
    assert kept is None and len(letters) == 4
    assert all("nothing else in the batch" in d.reason for d in letters)


def test_parquet_rows_are_measured_as_the_file_gives_them_back():
    batch = offered("sft", group("task-b")[:2])
    rows: list[dict[str, Any]] = [
        {"trajectory_id": "task-b-0", "x": 1},
        {"trajectory_id": "task-b-1", "w": "q" * 50},
    ]
    batch.rows = rows
    limit = len(canonical_lines(rows)[1]) + 2  # task-b-1 fits as it is, not with "x":null added
    assert leave_out_oversize(batch, "jsonl", max_row_bytes=limit) == (batch, [])
    kept, [letter] = leave_out_oversize(batch, "parquet", max_row_bytes=limit)
    assert letter.trajectory_id == "task-b-1" and kept.rows == rows[:1]


def test_an_oversize_row_that_names_no_trajectory_is_an_error_not_a_silent_drop():
    batch = offered("sft", group("task-b")[:1])
    batch.rows = [{"messages": "m" * 100}]
    with pytest.raises(TrainerError, match=r"row 0 takes \d+ bytes .* names no trajectory of the batch"):
        leave_out_oversize(batch, max_row_bytes=50)


class FakeProducer:
    """Acknowledges every send at once and keeps (topic, value)."""

    def __init__(self):
        self.sent: list[tuple[str, bytes]] = []

    def send(self, topic, key=None, value=None):
        self.sent.append((topic, value))
        return self

    def get(self, timeout=None):
        return None

    def flush(self):
        return None

    def events(self, topic):
        return [decode(v) for t, v in self.sent if t == topic]


def builder(tmp_path) -> BatchBuilder:
    config = BatchBuilderConfig(data_dir=tmp_path, planner=planner(("sft", "grpo")).config)
    b = BatchBuilder(config)
    b.producer = FakeProducer()
    return b


def test_the_builder_publishes_the_rest_and_a_restart_on_the_same_input_goes_on(tmp_path):
    trajectories = group("task-a", big=3) + group("task-b")
    records = [Record(TOPIC, 0, i, t.trajectory_id.encode(), encode(t)) for i, t in enumerate(trajectories)]
    first = builder(tmp_path)
    for r in records:
        first.handle(r, 0.0)
    published = first.flush(0.0, force=True)
    assert sorted(e.kind for e in published) == ["grpo", "sft"]
    by_kind = {e.kind: e for e in published}
    assert "task-a-3" not in by_kind["sft"].trajectory_ids and len(by_kind["sft"].trajectory_ids) == 7
    assert sorted(by_kind["grpo"].trajectory_ids) == [f"task-b-{i}" for i in range(4)]
    letters = first.producer.events(topics.DLQ)
    assert sorted(d.trajectory_id for d in letters) == [*(f"task-a-{i}" for i in range(4)), "task-a-3"]
    assert {(d.source_offset, d.trajectory_id) for d in letters} >= {(3, "task-a-3"), (0, "task-a-0")}
    assert [m.builder_config["left_out_by_row_size"] for m in BatchStore(tmp_path).manifests("grpo")] == [4]
    # killed before committing: the same records again, after a restart on the same data dir
    again = builder(tmp_path)
    for r in records:
        again.handle(r, 1.0)
    assert again.flush(1.0, force=True) == []  # nothing new to publish, and no error
    assert {d.event_id for d in again.producer.events(topics.DLQ)} <= {d.event_id for d in letters}
    assert len(BatchStore(tmp_path).manifests()) == 2

"""One base model: GRPO leaves out, counts and reports trajectories with a step recorded under another
tokenizer than the training base's; matching ones are kept; unchecked without a base hash."""

from __future__ import annotations

import logging

import pytest

from consumers.batching.base_tokenizer import BaseTokenizerHash
from consumers.batching.builders.groups import GroupConfig
from consumers.batching.builders.grpo import GRPOGroupBuilder
from consumers.batching.config import PlannerConfig
from consumers.batching.planner import Planner
from consumers.errors import ConsumerConfigError
from schemas.events import ScoredStep, TrajectoryScored
from schemas.records import Record

BASE, OTHER = "a" * 16, "b" * 16


def _traj(tid: str, hashes: list[str | None], success: bool = True) -> TrajectoryScored:
    steps = [
        ScoredStep(
            step_index=i, tool="calc", prompt_token_ids=[1, 2] if i == 0 else [7],
            prompt_delta_start=0 if i == 0 else 3 * i + 1, token_ids=[3, 4], logprobs=[-0.1, -0.2],
            token_continuity="first" if i == 0 else "ok", tokenizer_hash=h, event_id=f"{tid}-{i}",
        )
        for i, h in enumerate(hashes)
    ]  # fmt: skip
    return TrajectoryScored(
        event_id=f"e-{tid}", trajectory_id=tid, occurred_at="2026-01-01T00:00:00Z", producer="p",
        task_id="k", group_id="g", success=success, steps=steps,
    )  # fmt: skip


class Counted:
    """A base hash that counts how often it was asked for."""

    def __init__(self, value: str = BASE):
        self.value, self.calls = value, 0

    def __call__(self) -> str:
        self.calls += 1
        return self.value


def test_a_mismatched_step_is_left_out_counted_and_logged_a_matching_one_kept(caplog):
    builder = GRPOGroupBuilder(base_tokenizer_hash=Counted())
    group = [_traj("a", [BASE, BASE]), _traj("b", [BASE, OTHER], success=False), _traj("c", [BASE], False)]
    with caplog.at_level(logging.WARNING):
        rows = builder.build(group)
    assert [r["trajectory_id"] for r in rows] == ["a", "c"]
    assert (rows[0]["group_size"], rows[0]["group_complete"]) == (2, False)
    assert rows[0]["advantage"] > 0 > rows[1]["advantage"]  # the baseline is over the kept members only
    assert builder.take_left_out() == {"left_out_by_tokenizer": 1, "left_out_by_tokenizer_trajectories": 1}
    assert builder.take_left_out() == {"left_out_by_tokenizer": 0, "left_out_by_tokenizer_trajectories": 0}
    assert f"recorded with tokenizer {OTHER!r}, not the training base's {BASE}" in caplog.text


def test_all_matching_keeps_the_group_complete_and_counts_nothing():
    builder = GRPOGroupBuilder(base_tokenizer_hash=Counted())
    rows = builder.build([_traj("a", [BASE]), _traj("b", [BASE], success=False)])
    assert [r["group_complete"] for r in rows] == [True, True]
    assert builder.take_left_out()["left_out_by_tokenizer"] == 0


def test_steps_without_a_hash_are_not_checked_and_the_base_is_not_loaded_for_them():
    base = Counted()
    builder = GRPOGroupBuilder(base_tokenizer_hash=base)
    rows = builder.build([_traj("a", [None]), _traj("b", [None], success=False)])
    assert len(rows) == 2 and base.calls == 0


def test_without_a_base_hash_nothing_is_checked():
    rows = GRPOGroupBuilder().build([_traj("a", [OTHER]), _traj("b", [OTHER], success=False)])
    assert len(rows) == 2


def test_the_batch_reports_the_count_in_its_builder_config():
    planner = Planner(
        PlannerConfig(kinds=("grpo",), batch_trajectories=3, flush_interval_s=100,
                      groups=GroupConfig(group_size=3, timeout_s=300)),
        base_tokenizer_hash=Counted(),
    )  # fmt: skip
    group = [_traj("a", [BASE, OTHER, OTHER]), _traj("b", [BASE], False), _traj("c", [BASE, BASE])]
    for offset, t in enumerate(group):
        planner.offer(t, Record("trajectory.scored", 0, offset), now=0.0)
    (batch,) = planner.due(0.0)
    assert [r["trajectory_id"] for r in batch.rows] == ["b", "c"]
    assert batch.builder_config["left_out_by_tokenizer"] == 2
    assert batch.builder_config["left_out_by_tokenizer_trajectories"] == 1
    assert batch.meta()["builder_config"]["left_out_by_tokenizer"] == 2  # what batch.built carries


def test_a_base_that_is_not_a_directory_is_refused_at_start(tmp_path):
    with pytest.raises(ConsumerConfigError, match=r"--base-model: '/no/such/model' is not a local directory"):
        BaseTokenizerHash("/no/such/model", tmp_path)


def test_the_hash_is_the_one_the_server_computes(tmp_path, monkeypatch):
    import transformers

    from clients.base_model import tokenizer_hash

    (tmp_path / "tokenizer.json").write_text('{"v": 1}')
    fake = type("Tok", (), {"chat_template": "{{ m }}", "get_vocab": lambda self: {}})()
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path: fake)
    base = BaseTokenizerHash(str(tmp_path), tmp_path / "data")
    assert base() == tokenizer_hash(fake, tmp_path) and base() == base()

"""No silent truncation: rows over --max-length are left out of the update and counted; the last,
partial optimizer step divides by the micro batches it has; gradient checkpointing is an option
that changes memory, not the update."""

from __future__ import annotations

import doctest

import pytest

from consumers.batching.builders.dpo import DPOPairConfig, StepPairBuilder
from consumers.batching.builders.grpo import GRPOGroupBuilder, GRPOGroupConfig
from consumers.batching.builders.sft import SFTBuilder, SFTBuilderConfig
from consumers.batching.tokenize import Encoded
from consumers.errors import TrainerError
from consumers.training import checkpoints, row_tensors
from consumers.training.config import TrainConfig
from consumers.training.executor import TrainingExecutor
from tests.support.trainer_data import golden_group

SFT_ROWS = SFTBuilder(SFTBuilderConfig(require_success=False)).build(golden_group())
DPO_ROWS = StepPairBuilder(DPOPairConfig(max_pairs_per_group=20)).build(golden_group())
GRPO_ROWS = GRPOGroupBuilder(GRPOGroupConfig(retokenize=True)).build(golden_group())
CONFIG = {"learning_rate": 5e-3, "micro_batch_size": 2, "lr_schedule": "constant"}


def _lengths(executor, rows, key=None):
    return [len(executor.encode_row(r, key).input_ids) for r in rows]


def _trainable(executor):
    return {n: p.detach().clone() for n, p in executor.model.named_parameters() if p.requires_grad}


def _same(a, b, tol=0.0) -> bool:
    return all(float((a[k] - b[k]).abs().max()) <= tol for k in a)


def test_docstring_examples_hold():
    for module in (row_tensors, checkpoints):
        result = doctest.testmod(module)
        assert result.attempted >= 2 and result.failed == 0, module.__name__


def test_a_row_over_max_length_is_left_out_and_counted_not_cut(data_dir, caplog):
    probe = TrainingExecutor(TrainConfig(**CONFIG), data_dir)
    lengths = _lengths(probe, SFT_ROWS)
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    limit = lengths[longest] - 1
    assert sum(n > limit for n in lengths) == 1, lengths  # exactly one row is over
    with caplog.at_level("WARNING"):
        over = TrainingExecutor(TrainConfig(**CONFIG, max_length=limit), data_dir)
        metrics = over.train_rows(SFT_ROWS, "sft", batch_id="b-long")
    assert metrics["rows_over_max_length"] == 1.0
    assert metrics["tokens_over_max_length"] == float(lengths[longest])
    assert "b-long" in caplog.text and "1 of 4 rows over --max-length" in caplog.text
    # the update is the one on the other rows alone: the long row was not trained on, even cut
    kept = [r for i, r in enumerate(SFT_ROWS) if i != longest]
    alone = TrainingExecutor(TrainConfig(**CONFIG), data_dir)
    expected = alone.train_rows(kept, "sft")
    assert metrics["tokens"] == expected["tokens"] and metrics["loss"] == pytest.approx(expected["loss"])
    assert _same(_trainable(over), _trainable(alone), tol=1e-6)


def test_nothing_over_counts_zero(data_dir):
    metrics = TrainingExecutor(TrainConfig(**CONFIG), data_dir).train_rows(SFT_ROWS, "sft")
    assert (metrics["rows_over_max_length"], metrics["tokens_over_max_length"]) == (0.0, 0.0)


def test_a_dpo_pair_with_one_side_over_is_left_out_whole(data_dir):
    probe = TrainingExecutor(TrainConfig(**CONFIG), data_dir)
    chosen, rejected = _lengths(probe, DPO_ROWS, "chosen"), _lengths(probe, DPO_ROWS, "rejected")
    limit = max(max(chosen), max(rejected)) - 1
    over = [i for i in range(len(DPO_ROWS)) if max(chosen[i], rejected[i]) > limit]
    assert 0 < len(over) < len(DPO_ROWS)
    metrics = TrainingExecutor(TrainConfig(**CONFIG, max_length=limit), data_dir).train_rows(DPO_ROWS, "dpo")
    assert metrics["rows_over_max_length"] == float(len(over))
    assert metrics["tokens_over_max_length"] == float(sum(chosen[i] + rejected[i] for i in over))


def test_a_long_grpo_trajectory_is_left_out_and_its_version_says_so(data_dir):
    """The issue's case: a GRPO row whose tail (the final answer) would have been cut while its
    advantage still counted the outcome. It is left out whole; `policy.updated` carries the count."""
    probe = TrainingExecutor(TrainConfig(**CONFIG), data_dir)
    lengths = _lengths(probe, GRPO_ROWS)
    limit = max(lengths) - 1
    over = [n for n in lengths if n > limit]
    assert 0 < len(over) < len(GRPO_ROWS), lengths
    executor = TrainingExecutor(TrainConfig(**CONFIG, max_length=limit), data_dir)
    event = executor.train_batch(GRPO_ROWS, "grpo", "g-long")
    assert event is not None and event.policy_version == "v1"
    assert event.metrics["rows_over_max_length"] == float(len(over))
    assert event.metrics["tokens_over_max_length"] == float(sum(over))


def test_every_row_over_is_an_error_naming_the_option_and_the_longest(data_dir):
    executor = TrainingExecutor(TrainConfig(**CONFIG, max_length=8), data_dir)
    longest = max(_lengths(executor, SFT_ROWS))
    with pytest.raises(TrainerError, match=rf"--max-length.*b9.*longest has {longest} tokens"):
        executor.train_batch(SFT_ROWS, "sft", "b9")
    assert executor.state.policy_version is None  # no version, nothing checkpointed


def test_collate_refuses_a_row_it_would_have_to_cut():
    row = Encoded([1, 2, 3], [1, 2, 3], [0, 0, 0], [None] * 3)
    with pytest.raises(TrainerError, match="row 0 has 3 tokens, over --max-length 2"):
        row_tensors.collate([row], pad_id=0, max_length=2, device="cpu")


def test_a_partial_last_step_divides_by_the_micro_batches_it_has(data_dir):
    """One micro batch in a step meant for two is a whole step's gradient, not half of one."""
    rows = SFT_ROWS[:1]
    one = TrainingExecutor(TrainConfig(**CONFIG, gradient_accumulation_steps=1), data_dir)
    two = TrainingExecutor(TrainConfig(**CONFIG, gradient_accumulation_steps=2), data_dir)
    m1, m2 = one.train_rows(rows, "sft"), two.train_rows(rows, "sft")
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-6) and m1["grad_norm"] > 0
    assert _same(_trainable(one), _trainable(two))


@pytest.mark.parametrize("lora", [True, False])
def test_gradient_checkpointing_reaches_the_model_and_keeps_the_update(data_dir, lora):
    plain = TrainingExecutor(TrainConfig(**CONFIG, lora=lora), data_dir)
    saving = TrainingExecutor(TrainConfig(**CONFIG, lora=lora, gradient_checkpointing=True), data_dir)
    assert saving.model.is_gradient_checkpointing and not plain.model.is_gradient_checkpointing
    a, b = plain.train_rows(SFT_ROWS, "sft"), saving.train_rows(SFT_ROWS, "sft")
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4) and b["loss"] == pytest.approx(a["loss"])
    assert _same(_trainable(plain), _trainable(saving), tol=1e-5)

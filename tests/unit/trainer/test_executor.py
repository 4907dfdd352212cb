"""CPU training on the tiny local model: losses go down, checkpoints reload exactly."""

from __future__ import annotations

import pytest

from consumers.trainer.builders import (
    DPOPairConfig,
    GRPOGroupBuilder,
    SFTBuilder,
    SFTBuilderConfig,
    StepPairBuilder,
)
from consumers.trainer.executor import TrainConfig, TrainingExecutor, step_weights
from consumers.trainer.losses import IGNORE_INDEX
from tests.support.trainer_data import golden_group

CONFIG = TrainConfig(learning_rate=5e-3, micro_batch_size=4)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A data dir with the tiny model built once (building it trains a tokenizer)."""
    from consumers.trainer.tiny import tiny_model_dir

    root = tmp_path_factory.mktemp("tiny")
    tiny_model_dir(root)
    return root


@pytest.fixture
def data_dir(model_dir, tmp_path):
    (tmp_path / "models").symlink_to(model_dir / "models")
    return tmp_path


def _losses(executor, rows, method, n=4):
    return [executor.train_rows(rows, method)["loss"] for _ in range(n)]


def test_sft_loss_goes_down(data_dir):
    rows = SFTBuilder(SFTBuilderConfig(require_success=False)).build(golden_group())
    losses = _losses(TrainingExecutor(CONFIG, data_dir), rows, "sft")
    assert losses[-1] < losses[0] - 0.05, losses


def test_dpo_reference_is_the_adapter_disabled_model_and_loss_goes_down(data_dir):
    rows = StepPairBuilder(DPOPairConfig(max_pairs_per_group=20)).build(golden_group())
    executor = TrainingExecutor(TrainConfig(learning_rate=5e-3, micro_batch_size=8), data_dir)
    first = executor.train_rows(rows, "dpo")
    assert first["loss_first_epoch"] == pytest.approx(0.693147, abs=1e-4)  # fresh LoRA: policy == reference
    losses = _losses(executor, rows, "dpo")
    assert losses[-1] < first["loss"] and losses[-1] < losses[0], losses


def test_grpo_clipped_objective_goes_down_with_fixed_old_logprobs(data_dir):
    rows = GRPOGroupBuilder().build(golden_group())
    config = TrainConfig(learning_rate=5e-3, micro_batch_size=4, epochs=4)
    metrics = TrainingExecutor(config, data_dir).train_rows(rows, "grpo")
    # epoch 1 sits at ratio 1 (old logprobs computed once, no_grad): loss = -token-mean(A)
    assert metrics["loss"] < metrics["loss_first_epoch"] - 1e-3, metrics


def test_grpo_uses_producer_logprobs_when_present(data_dir):
    executor = TrainingExecutor(CONFIG, data_dir)
    rows = GRPOGroupBuilder().build(golden_group())
    for row in rows:  # pretend the producer sampled these tokens with a much lower probability
        enc = executor.encode_row(row)
        ids = [i for i, lab in zip(enc.input_ids, enc.labels, strict=True) if lab != IGNORE_INDEX]
        steps = [s for s, lab in zip(enc.steps, enc.labels, strict=True) if lab != IGNORE_INDEX]
        row["step_token_ids"] = [
            [i for i, s in zip(ids, steps, strict=True) if s == k] for k in sorted(set(steps))
        ]
        row["step_logprobs"] = [[-50.0] * len(t) for t in row["step_token_ids"]]
    _, labels, _, _, old = executor._grpo_tensors(rows)
    assert old is not None and float(old[labels[:, 1:] != IGNORE_INDEX].max()) == -50.0
    # ratios are huge, so every token is clipped: the loss is -(1+eps) * token-mean(A) on positive A
    metrics = executor.train_rows(rows, "grpo")
    assert metrics["loss"] == pytest.approx(metrics["loss_first_epoch"])


def test_step_weights_never_zero_the_loss():
    assert step_weights([-1, 0, 1, 1], [None, None]) == [1.0, 1.0, 1.0, 1.0]
    assert step_weights([0, 1], [0.0, 1.0]) == [0.0, 2.0]


def test_step_weighted_sft_trains(data_dir):
    rows = SFTBuilder(SFTBuilderConfig(require_success=False)).build(golden_group())
    config = TrainConfig(learning_rate=5e-3, step_weighted_loss=True)
    losses = _losses(TrainingExecutor(config, data_dir), rows, "sft", n=3)
    assert losses[-1] < losses[0]


def test_checkpoint_reloads_with_identical_logits_and_optimizer(data_dir):
    rows = SFTBuilder(SFTBuilderConfig(require_success=False)).build(golden_group())
    executor = TrainingExecutor(CONFIG, data_dir)
    event = executor.train_batch(rows, "sft", "sft-batch-1")
    assert event.policy_version == "v1" and event.step == 1 and event.batch_ids == ["sft-batch-1"]
    assert (data_dir / "checkpoints" / "v1" / "adapter").is_dir()
    ids = executor.encode_row(rows[0]).input_ids
    before = executor.logits(ids)
    reloaded = TrainingExecutor(CONFIG, data_dir)
    assert reloaded.state.policy_version == "v1" and reloaded.state.batches == ["sft-batch-1"]
    assert (reloaded.logits(ids) - before).abs().max().item() == 0.0
    assert reloaded.optimizer.state_dict()["state"], "optimizer state restored"
    second = reloaded.train_batch(rows, "sft", "sft-batch-2")
    assert (second.policy_version, second.previous_version, second.step) == ("v2", "v1", 2)
    assert (reloaded.logits(ids) - before).abs().max().item() > 0

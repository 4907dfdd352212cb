"""CPU training on the tiny local model: losses go down, checkpoints reload exactly."""

from __future__ import annotations

import math

import pytest

from consumers.batching.builders.dpo import DPOPairConfig, StepPairBuilder
from consumers.batching.builders.grpo import GRPOGroupBuilder, GRPOGroupConfig
from consumers.batching.builders.sft import SFTBuilder, SFTBuilderConfig
from consumers.training.config import TrainConfig
from consumers.training.executor import TrainingExecutor
from consumers.training.losses import IGNORE_INDEX, step_weights
from consumers.training.offpolicy import truncated_weight
from tests.support.trainer_data import golden_group

CONFIG = TrainConfig(learning_rate=5e-3, micro_batch_size=4)
GRPO = GRPOGroupBuilder(GRPOGroupConfig(retokenize=True))  # message rows, tokenized by the executor


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
    rows = GRPO.build(golden_group())
    config = TrainConfig(learning_rate=5e-3, micro_batch_size=4, epochs=4)
    metrics = TrainingExecutor(config, data_dir).train_rows(rows, "grpo")
    # epoch 1 sits at ratio 1 (old logprobs computed once, no_grad): loss = -token-mean(A)
    assert metrics["loss"] < metrics["loss_first_epoch"] - 1e-3, metrics


def _token_rows(executor, rows, behaviour=None, version="v0"):
    """GRPO rows in the token shape the policy server's ids give: `behaviour` is the logprob
    recorded for every trainable token (None: not recorded)."""
    out = []
    for row in rows:
        enc = executor.encode_row(row)
        lps = [behaviour if lab != IGNORE_INDEX else None for lab in enc.labels]
        keep = ("advantage", "step_advantages", "group_id", "group_size", "trajectory_id", "task_id")
        out.append({k: row[k] for k in keep} | {
            "input_ids": enc.input_ids, "labels": enc.labels, "step_ids": enc.steps,
            "behaviour_logprobs": lps if behaviour is not None else None,
            "behaviour_version": version, "policy_version": version, "reward": row["reward"],
        })  # fmt: skip
    return out


def _trainable_logps(executor, row) -> float:
    """Sum of log p(token) over a row's trainable tokens under the executor's current weights."""
    import torch

    enc = executor.encode_row(row)
    logps = torch.log_softmax(executor.logits(enc.input_ids), -1)
    return sum(
        float(logps[i - 1, tok])
        for i, (tok, lab) in enumerate(zip(enc.input_ids, enc.labels, strict=True))
        if lab != -100
    )


def test_tis_weights_are_the_truncated_ratio_to_the_recorded_logprobs(data_dir):
    executor = TrainingExecutor(CONFIG, data_dir)
    rows = GRPO.build(golden_group())
    plain = executor.train_rows(_token_rows(executor, rows), "grpo")
    assert (plain["is_ratio_mean"], plain["ess"], plain["is_truncated_fraction"]) == (1.0, 1.0, 0.0)
    # recorded logprob 0 (p = 1): every ratio is p_old < 1, untruncated; check against plain maths
    token_rows = _token_rows(executor, rows, behaviour=0.0)
    import torch

    (_, labels, _, _, _, weight, _), stats = executor._grpo_prepare(token_rows[:1])
    enc = executor.encode_row(rows[0])
    logps = torch.log_softmax(executor.logits(enc.input_ids), -1)
    expected = [
        truncated_weight(float(logps[i - 1, t]), 0.0, 2.0)
        for i, (t, lab) in enumerate(zip(enc.input_ids, enc.labels, strict=True)) if lab != IGNORE_INDEX
    ]  # fmt: skip
    got = weight[labels[:, 1:] != IGNORE_INDEX].tolist()
    assert got == pytest.approx(expected, rel=1e-4) and max(expected) < 1.0
    assert stats["n"] == len(expected) and stats["truncated"] == 0
    assert math.isclose(stats["ratio_sum"], sum(expected), rel_tol=1e-4)


def test_tis_truncates_far_off_policy_tokens_and_none_turns_it_off(data_dir, caplog):
    rows = GRPO.build(golden_group())
    executor = TrainingExecutor(CONFIG, data_dir)
    fresh = executor.train_rows(_token_rows(executor, rows), "grpo")["loss_first_epoch"]
    # the sampler gave these tokens logprob -50: ratios ~e^50, every weight truncated to 2, so at
    # rho = 1 the first-epoch loss is -2 * token-mean(A): twice the loss of on-policy rows
    far = TrainingExecutor(CONFIG, data_dir)
    metrics = far.train_rows(_token_rows(far, rows, behaviour=-50.0), "grpo")
    assert metrics["loss_first_epoch"] == pytest.approx(2 * fresh, rel=1e-4)
    assert metrics["is_truncated_fraction"] == 1.0 and metrics["is_ratio_max"] > 1e15
    assert metrics["ess"] == pytest.approx(1.0)  # all weights equal (2): no loss of sample size
    with caplog.at_level("WARNING"):
        off = TrainingExecutor(TrainConfig(learning_rate=5e-3, is_correction="none"), data_dir)
    assert "off-policy correction disabled" in caplog.text
    metrics = off.train_rows(_token_rows(off, rows, behaviour=-50.0), "grpo")
    assert metrics["loss_first_epoch"] == pytest.approx(fresh, rel=1e-4)
    assert metrics["is_truncated_fraction"] == 0.0 and metrics["is_ratio_max"] > 1e15


def test_message_rows_take_their_behaviour_logprobs_from_step_logprobs(data_dir):
    executor = TrainingExecutor(CONFIG, data_dir)
    rows = GRPO.build(golden_group())
    for row in rows:  # the producer recorded the sampled ids with a much lower probability
        enc = executor.encode_row(row)
        ids = [i for i, lab in zip(enc.input_ids, enc.labels, strict=True) if lab != IGNORE_INDEX]
        steps = [s for s, lab in zip(enc.steps, enc.labels, strict=True) if lab != IGNORE_INDEX]
        row["step_token_ids"] = [
            [i for i, s in zip(ids, steps, strict=True) if s == k] for k in sorted(set(steps))
        ]
        row["step_logprobs"] = [[-50.0] * len(t) for t in row["step_token_ids"]]
    *_, behaviour = executor._grpo_tensors(rows)
    assert float(behaviour.nan_to_num(0.0).min()) == -50.0
    assert executor.train_rows(rows, "grpo")["is_truncated_fraction"] == 1.0


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_grpo_gradient_follows_the_advantage_sign(data_dir, advantage):
    config = TrainConfig(learning_rate=1e-2, lr_schedule="constant", micro_batch_size=1)
    executor = TrainingExecutor(config, data_dir)
    [row] = _token_rows(executor, GRPO.build(golden_group())[:1])
    row |= {"advantage": advantage, "step_advantages": None}
    before = _trainable_logps(executor, row)
    executor.train_rows([row], "grpo")
    after = _trainable_logps(executor, row)
    assert (after - before) * advantage > 0.1, (before, after)


def _zero_advantage_rows(executor):
    rows = _token_rows(executor, GRPO.build(golden_group()))
    return [r | {"advantage": 0.0, "step_advantages": None} for r in rows]


@pytest.mark.parametrize("lora", [True, False])
def test_kl_term_pulls_toward_the_base_reference_with_and_without_lora(data_dir, lora):
    sft = SFTBuilder(SFTBuilderConfig(require_success=False)).build(golden_group())
    moved = TrainingExecutor(TrainConfig(learning_rate=2e-2, lora=lora), data_dir)
    moved.train_batch(sft, "sft", "sft-1")  # v1: away from the base weights
    moved.train_batch(sft, "sft", "sft-2")
    config = TrainConfig(learning_rate=5e-3, lora=lora, kl_beta=1.0, lr_schedule="constant")
    executor = TrainingExecutor(config, data_dir)  # resumed at v2; the reference is still base
    rows = _zero_advantage_rows(executor)
    kls = [executor.train_rows(rows, "grpo")["kl"] for _ in range(6)]
    assert kls[0] > 1e-3, kls  # v2 differs from base: the reference is not the resumed checkpoint
    assert kls[-1] < kls[0] * 0.8, kls
    without = TrainingExecutor(TrainConfig(learning_rate=5e-3, lora=lora), data_dir)
    assert without.train_rows(rows, "grpo")["kl"] == 0.0  # kl_beta 0: no reference, no KL


@pytest.mark.parametrize("lora", [True, False])
def test_a_named_reference_version_loads_its_checkpoint(data_dir, lora):
    from consumers.errors import TrainerError

    sft = SFTBuilder(SFTBuilderConfig(require_success=False)).build(golden_group())
    TrainingExecutor(TrainConfig(learning_rate=2e-2, lora=lora), data_dir).train_batch(sft, "sft", "s1")
    config = TrainConfig(learning_rate=5e-3, lora=lora, kl_beta=1.0, reference="v1")
    executor = TrainingExecutor(config, data_dir)  # the weights trained are v1 too
    assert executor.train_rows(_zero_advantage_rows(executor), "grpo")["kl"] == pytest.approx(0, abs=1e-5)
    with pytest.raises(TrainerError, match="--reference: no checkpoint for 'v9'"):
        TrainingExecutor(TrainConfig(kl_beta=1.0, reference="v9", lora=lora), data_dir)


def _grpo_group(executor, group, versions):
    rows = _token_rows(executor, GRPO.build(golden_group()))
    return [
        r | {"group_id": group, "trajectory_id": f"{group}-{i}", "behaviour_version": v, "policy_version": v}
        for i, (r, v) in enumerate(zip(rows, versions, strict=True))
    ]


def test_stale_groups_are_dropped_whole_and_counted_into_the_next_version(data_dir):
    config = TrainConfig(learning_rate=5e-3, max_staleness=0)
    executor = TrainingExecutor(config, data_dir)
    sft = SFTBuilder(SFTBuilderConfig(require_success=False)).build(golden_group())
    executor.train_batch(sft, "sft", "b1")  # v1
    stale = _grpo_group(executor, "a", ["v1", "v1", "v0", "v1"])  # one old row: the whole group goes
    fresh = _grpo_group(executor, "b", ["v1"] * 4)
    ranges = {"training.batches": {"0": [3, 7]}}
    event = executor.train_batch(stale + fresh, "grpo", "b2", source_ranges=ranges)
    assert event.policy_version == "v2" and event.dropped_groups == 1 and event.source_ranges == ranges
    assert event.trajectory_ids == ["b-0", "b-1", "b-2", "b-3"] and event.behaviour_versions == ["v1"]
    assert event.staleness_histogram == {"0": 1}  # v1 rows against the v1 weights
    assert event.metrics["trained_groups"] == 1.0 and event.metrics["dropped_groups"] == 1.0
    assert {"loss", "is_ratio_mean", "ess", "clipped_fraction", "kl", "lr", "grad_norm"} <= set(event.metrics)
    assert executor.train_batch(_grpo_group(executor, "c", ["v1"] * 4), "grpo", "b3") is None  # 2-1 > 0
    reloaded = TrainingExecutor(config, data_dir)
    assert reloaded.state.batches == ["b1", "b2", "b3"] and reloaded.state.pending_dropped == 1
    event = reloaded.train_batch(_grpo_group(reloaded, "d", ["v2"] * 4), "grpo", "b4")
    assert (event.policy_version, event.previous_version, event.dropped_groups) == ("v3", "v2", 1)
    assert event.staleness_histogram == {"0": 1} and reloaded.state.pending_dropped == 0


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

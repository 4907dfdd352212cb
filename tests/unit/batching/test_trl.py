"""The batch files load with Hugging Face `datasets` and pass one step of TRL's trainers (tiny model)."""

from __future__ import annotations

import copy

import pytest

from consumers.batching.batch_writer import BatchStore
from consumers.batching.builders.dpo import DPOPairBuilder, DPOPairConfig, StepPairBuilder
from consumers.batching.builders.sft import SFTBuilder, SFTBuilderConfig
from consumers.batching.tokenize import SFTTokenizedBuilder
from tests.support.trainer_data import golden_group


@pytest.fixture(scope="module")
def tiny():
    from consumers.tiny_model import build_model, train_tokenizer

    tokenizer = train_tokenizer()
    return tokenizer, build_model(tokenizer)


def _write(tmp_path, kind, rows) -> str:
    meta = {
        "trajectory_ids": sorted({r.get("trajectory_id") or r["chosen_trajectory_id"] for r in rows}),
        "content_hashes": [],
        "source_offsets": {},
        "reward_versions": [],
        "calibration_versions": [],
        "policy_versions": [],
        "builder_config": {},
    }
    return BatchStore(tmp_path).write(kind, rows, meta).path


def _common(tmp_path):
    return {
        "output_dir": str(tmp_path / "out"),
        "max_steps": 1,
        "per_device_train_batch_size": 2,
        "report_to": "none",
        "save_strategy": "no",
        "use_cpu": True,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }


def test_sft_batch_trains_one_step_with_trl(tmp_path, tiny):
    import datasets
    from trl import SFTConfig, SFTTrainer

    tokenizer, model = tiny
    path = _write(tmp_path, "sft", SFTBuilder(SFTBuilderConfig(require_success=False)).build(golden_group()))
    dataset = datasets.load_dataset("json", data_files=path, split="train")
    assert dataset.num_rows == 4 and {"messages", "tools"} <= set(dataset.column_names)
    config = SFTConfig(**_common(tmp_path), assistant_only_loss=True, learning_rate=1e-3)
    trainer = SFTTrainer(
        model=copy.deepcopy(model),
        args=config,
        train_dataset=dataset.select_columns(["messages", "tools"]),
        processing_class=tokenizer,
    )
    out = trainer.train()
    assert out.global_step == 1 and out.training_loss > 0


def test_pretokenized_sft_batch_trains_one_step_with_trl(tmp_path, tiny):
    import datasets
    from trl import SFTConfig, SFTTrainer

    tokenizer, model = tiny
    rows = SFTTokenizedBuilder(tokenizer, SFTBuilderConfig(require_success=False)).build(golden_group())
    dataset = datasets.load_dataset("json", data_files=_write(tmp_path, "sft_tokenized", rows), split="train")
    trainer = SFTTrainer(
        model=copy.deepcopy(model),
        args=SFTConfig(**_common(tmp_path)),
        train_dataset=dataset.select_columns(["input_ids", "attention_mask", "labels"]),
        processing_class=tokenizer,
    )
    assert trainer.train().global_step == 1


@pytest.mark.parametrize("builder", [DPOPairBuilder, StepPairBuilder])
def test_dpo_batches_train_one_step_with_trl(tmp_path, tiny, builder):
    import datasets
    from trl import DPOConfig, DPOTrainer

    tokenizer, model = tiny
    rows = builder(DPOPairConfig(strategy="all_pairs", max_pairs_per_group=4)).build(golden_group())
    dataset = datasets.load_dataset("json", data_files=_write(tmp_path, "dpo", rows), split="train")
    assert {"prompt", "chosen", "rejected"} <= set(dataset.column_names)
    policy = copy.deepcopy(model)
    trainer = DPOTrainer(
        model=policy,
        ref_model=copy.deepcopy(model),
        args=DPOConfig(**_common(tmp_path)),
        train_dataset=dataset.select_columns(["prompt", "chosen", "rejected", "tools"]),
        processing_class=tokenizer,
    )
    out = trainer.train()
    assert out.global_step == 1 and out.training_loss == pytest.approx(0.6931, abs=1e-3)  # log 2 at step 1

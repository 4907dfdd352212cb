"""Integration: datasets exported by `agentstream export` from a real chDB load with
`datasets.load_dataset(DIR)` and train one step in TRL's SFTTrainer, DPOTrainer and GRPOTrainer on a
tiny model built locally, as exported (no column picked, renamed or converted)."""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.integration

FORMATS = {"sft": "hf", "dpo": "parquet", "dpo_step": "jsonl", "grpo": "jsonl"}


@pytest.fixture(scope="module")
def exported(filled_chdb, agentstream_export, tmp_path_factory):
    """kind -> the `DatasetDict` of its export (each kind in the format of `FORMATS`)."""
    import datasets

    root = tmp_path_factory.mktemp("trl-exports")
    out = {}
    for kind, fmt in FORMATS.items():
        done = agentstream_export(
            "--clickhouse-url", filled_chdb, "--kind", kind, "--format", fmt, "--out", root / kind,
            "--no-require-success",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        out[kind] = datasets.load_dataset(str(root / kind))
    return out


@pytest.fixture(scope="module")
def tiny():
    from consumers.tiny_model import build_model, train_tokenizer

    tokenizer = train_tokenizer()
    return tokenizer, build_model(tokenizer)


def _args(tmp_path) -> dict:
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


def test_sft_export_trains_one_step_with_trl(exported, tiny, tmp_path):
    from trl import SFTConfig, SFTTrainer

    tokenizer, model = tiny
    dataset = exported["sft"]
    assert set(dataset) == {"train", "validation", "test"}
    trainer = SFTTrainer(
        model=copy.deepcopy(model),
        args=SFTConfig(**_args(tmp_path), assistant_only_loss=True, learning_rate=1e-3),
        train_dataset=dataset["train"],
        eval_dataset=dataset["validation"],
        processing_class=tokenizer,
    )
    out = trainer.train()
    assert out.global_step == 1 and out.training_loss > 0
    assert trainer.evaluate()["eval_loss"] > 0


@pytest.mark.parametrize("kind", ["dpo", "dpo_step"])
def test_dpo_exports_train_one_step_with_trl(exported, tiny, tmp_path, kind):
    from trl import DPOConfig, DPOTrainer

    tokenizer, model = tiny
    dataset = exported[kind]
    assert {"prompt", "chosen", "rejected"} <= set(dataset["train"].column_names)
    trainer = DPOTrainer(
        model=copy.deepcopy(model),
        ref_model=copy.deepcopy(model),
        args=DPOConfig(**_args(tmp_path)),
        train_dataset=dataset["train"],
        processing_class=tokenizer,
    )
    out = trainer.train()
    assert out.global_step == 1 and out.training_loss == pytest.approx(0.6931, abs=1e-3)  # log 2 at step 1


def test_grpo_export_trains_one_step_with_trl(exported, tiny, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    tokenizer, model = tiny
    dataset = exported["grpo"]["train"]
    seen = []

    def exported_reward(completions, reward, **_columns):
        """A trivial reward: the exported trajectory reward (a column TRL hands to reward functions)."""
        seen.extend(reward)
        return [float(r) for r in reward]

    config = GRPOConfig(**_args(tmp_path), num_generations=2, max_completion_length=8, logging_steps=1)
    trainer = GRPOTrainer(
        model=copy.deepcopy(model),
        reward_funcs=exported_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    assert trainer.train().global_step == 1
    assert seen and set(seen) <= set(dataset["reward"])

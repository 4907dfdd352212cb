"""Integration: a group of 2 ranks (gloo, CPU) trains what one process trains.

Two ranks with `gradient_accumulation_steps=1` against one process with `=2`, on the same rows:
an optimizer step holds the same micro batches, so the weights written after the update are equal
within fp32 reduction-order noise (TOL). Three micro batches per batch, so the last step is partial
(two micro batches, then one: rank 1 runs a zero-weight pass) and divides by the one it has.
Cases: SFT + LoRA (DDP), GRPO + LoRA (DDP), a full fine-tune (FSDP2), and that full fine-tune's
second batch from a new executor (every rank resumes the checkpoint rank 0 wrote); checkpoints pass
between a group and one process both ways (the optimizer state by index or by name). One process with
accumulation 1 (two optimizer steps where the group takes one) must differ: the check can fail.
"""

from __future__ import annotations

import pytest

from consumers.batching.builders.grpo import GRPOGroupBuilder, GRPOGroupConfig
from consumers.batching.builders.sft import SFTBuilder, SFTBuilderConfig
from consumers.training.config import TrainConfig
from consumers.training.executor import TrainingExecutor
from tests.support.trainer_data import golden_group
from tests.support.training_ranks import run_group

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # one group for all: ~90 s on 2 cores

TOL = 1e-5  # absolute, per weight, fp32 (learning rate 5e-3: a step moves weights ~5e-3)
BASE = {"learning_rate": 5e-3, "micro_batch_size": 1, "lr_schedule": "constant", "seed": 3}
SFT = SFTBuilder(SFTBuilderConfig(require_success=False)).build(golden_group())[:3]
GRPO = GRPOGroupBuilder(GRPOGroupConfig(retokenize=True)).build(golden_group())[:3]
CASES = {  # name: (config, rows, method, data dir of the case it continues)
    "sft_lora": ({}, SFT, "sft", None),
    "grpo_lora": ({}, GRPO, "grpo", None),
    "sft_full": ({"lora": False}, SFT, "sft", None),
    "sft_full_resumed": ({"lora": False}, SFT[::-1], "sft", "sft_full"),
}


def _data_dir(root, model_root, name):
    path = root / name
    if not path.exists():
        path.mkdir()
        (path / "models").symlink_to(model_root / "models")
    return path


def _weights(data_dir, version="v1"):
    from safetensors.torch import load_file

    ckpt = data_dir / "checkpoints" / version
    files = list(ckpt.glob("adapter/*.safetensors")) or list(ckpt.glob("model/*.safetensors"))
    assert files, f"no weights under {ckpt}"
    return load_file(files[0])


def _single(root, model_root, accumulation, names=tuple(CASES)):
    """The cases `names` in this process, with `accumulation` micro batches per optimizer step."""
    events = {}
    for name in names:
        config, rows, method, continues = CASES[name]
        data_dir = _data_dir(root, model_root, continues or name)
        train = TrainConfig(**BASE, **config, gradient_accumulation_steps=accumulation)
        events[name] = TrainingExecutor(train, data_dir).train_batch(rows, method, f"batch-{name}")
    return events


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from consumers.tiny_model import tiny_model_dir

    model_root = tmp_path_factory.mktemp("tiny")
    tiny_model_dir(model_root)
    group_root, out = tmp_path_factory.mktemp("group"), tmp_path_factory.mktemp("out")
    cases = [
        (name, BASE | config | {"gradient_accumulation_steps": 1},
         str(_data_dir(group_root, model_root, continues or name)), rows, method)
        for name, (config, rows, method, continues) in CASES.items()
    ]  # fmt: skip
    # a checkpoint one process wrote, continued by the group (the optimizer state changes layout)
    handover = _data_dir(group_root, model_root, "handover")
    first = TrainConfig(**BASE, lora=False, gradient_accumulation_steps=2)
    TrainingExecutor(first, handover).train_batch(SFT, "sft", "batch-sft_full")
    full = BASE | {"lora": False, "gradient_accumulation_steps": 1}
    group = run_group(
        [*cases, ("handover", full, str(handover), SFT[::-1], "sft")], world_size=2, out_dir=out
    )
    same_root, other_root = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("one_acc1")
    return {
        "group": (group_root, group),
        "one": (same_root, _single(same_root, model_root, accumulation=2)),
        "one_acc1": (other_root, _single(other_root, model_root, 1, names=("sft_lora", "sft_full"))),
    }


def _max_diff(a, b) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_equal_one_process_with_their_accumulation(runs, name):
    group_root, group = runs["group"]
    one_root, one = runs["one"]
    dir_name = CASES[name][3] or name
    version = "v2" if CASES[name][3] else "v1"
    assert _max_diff(_weights(group_root / dir_name, version), _weights(one_root / dir_name, version)) < TOL
    rank0, rank1 = group[name]
    assert rank0 == rank1  # the same event (id, version) and metrics on every rank
    assert rank0["version"] == one[name].policy_version == version
    single = one[name].metrics
    assert rank0["metrics"]["tokens"] == single["tokens"]
    assert rank0["metrics"]["loss"] == pytest.approx(single["loss"], abs=1e-5)
    assert rank0["metrics"]["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)


@pytest.mark.parametrize("name", ["sft_lora", "sft_full"])
def test_other_accumulation_differs(runs, name):
    """One process stepping after every micro batch is not what the group computes."""
    group_root, _ = runs["group"]
    other_root, _ = runs["one_acc1"]
    assert _max_diff(_weights(group_root / name), _weights(other_root / name)) > 100 * TOL


def test_checkpoints_pass_between_a_group_and_one_process(runs):
    import torch

    group_root, group = runs["group"]
    one_root, _ = runs["one"]
    # one process's v1, the group's v2: the update one process makes from its own v1
    assert group["handover"][0]["version"] == "v2"
    expected = _weights(one_root / "sft_full", "v2")
    assert _max_diff(_weights(group_root / "handover", "v2"), expected) < TOL
    # the group's v2 (FSDP: optimizer state by name) resumed by one process (by index)
    resumed = TrainingExecutor(TrainConfig(**BASE, lora=False), group_root / "sft_full")
    assert resumed.state.policy_version == "v2"
    mine = resumed.optimizer.state_dict()["state"]
    theirs = torch.load(one_root / "sft_full" / "checkpoints" / "v2" / "optimizer.pt")["state"]
    assert mine.keys() == theirs.keys() and len(mine) > 10
    for key in mine:
        assert float(mine[key]["step"]) == float(theirs[key]["step"]) == 2.0 * 2
        assert float((mine[key]["exp_avg"] - theirs[key]["exp_avg"]).abs().max()) < TOL


@pytest.mark.parametrize("name", ["sft_lora", "grpo_lora"])
def test_the_compared_update_moved_the_weights(runs, name):
    """Equal updates must not be equal by being empty: LoRA starts with B = 0, so an update that did
    nothing would leave every lora_B at 0 on both sides."""
    group_root, _ = runs["group"]
    moved = {k: float(v.abs().max()) for k, v in _weights(group_root / name).items() if "lora_B" in k}
    assert moved and max(moved.values()) > 100 * TOL

"""Integration: `agentstream train` started by the real `torchrun` (not by `--nproc`) joins the group
torchrun describes and makes the update one process makes with the group's accumulation.

torchrun starts 2 ranks of `agentstream train --batch FILE --no-publish` (micro batch 1, accumulation
1); one process trains the same rows with accumulation 2. The adapters written must be equal within
TOL, and must have moved (LoRA's B starts at 0), so the check can fail either way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from consumers.batching.builders.sft import SFTBuilder, SFTBuilderConfig
from consumers.training.config import TrainConfig
from consumers.training.executor import TrainingExecutor
from tests.support.processes import REPO, free_port
from tests.support.trainer_data import golden_group

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOL = 1e-5
ROWS = SFTBuilder(SFTBuilderConfig(require_success=False)).build(golden_group())[:3]
OPTIONS = {"learning_rate": 5e-3, "micro_batch_size": 1, "lr_schedule": "constant", "seed": 3}


def _adapter(data_dir: Path) -> dict:
    from safetensors.torch import load_file

    files = list((data_dir / "checkpoints" / "v1" / "adapter").glob("*.safetensors"))
    assert files, f"no adapter under {data_dir}"
    return load_file(files[0])


def _torchrun(batch: Path, data_dir: Path, timeout_s: float = 240) -> subprocess.CompletedProcess:
    torchrun = Path(sys.executable).with_name("torchrun")
    assert torchrun.exists(), f"torch's launcher is missing: {torchrun}"
    argv = [
        str(torchrun), "--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), "-m", "infra.cli", "train", "--batch", str(batch),
        "--method", "sft", "--no-publish", "--data-dir", str(data_dir), "--device", "cpu",
        "--learning-rate", "5e-3", "--micro-batch-size", "1", "--lr-schedule", "constant", "--seed", "3",
        "--gradient-accumulation-steps", "1",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.Popen(  # its own session: a timeout stops torchrun and both ranks
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in {timeout_s} s:\n{out[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, "")


def test_torchrun_ranks_train_what_one_process_trains(tmp_path):
    from consumers.tiny_model import tiny_model_dir

    models = tmp_path / "tiny"
    tiny_model_dir(models)
    group_dir, single_dir = tmp_path / "group", tmp_path / "single"
    for path in (group_dir, single_dir):
        path.mkdir()
        (path / "models").symlink_to(models / "models")
    batch = tmp_path / "rows.jsonl"
    batch.write_text("".join(json.dumps(r) + "\n" for r in ROWS))

    done = _torchrun(batch, group_dir)
    assert done.returncode == 0, done.stdout[-3000:]
    state = json.loads((group_dir / "checkpoints" / "v1" / "state.json").read_text())
    assert state["policy_version"] == "v1" and state["batches"] == ["rows"]

    single = TrainingExecutor(TrainConfig(**OPTIONS, gradient_accumulation_steps=2), single_dir)
    single.train_batch(ROWS, "sft", "rows")
    group, one = _adapter(group_dir), _adapter(single_dir)
    assert group.keys() == one.keys()
    assert max(float((group[k] - one[k]).abs().max()) for k in group) < TOL
    moved = max(float(v.abs().max()) for k, v in group.items() if "lora_B" in k)
    assert moved > 100 * TOL

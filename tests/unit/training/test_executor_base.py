"""One base model: every `policy.updated` names the base the executor trained (its weights' id and
its tokenizer's hash, as the policy server computes them), and a checkpoint of another base is
refused at start rather than resumed."""

from __future__ import annotations

import json
import shutil

import pytest

from clients.base_model import base_model_id, tokenizer_hash
from consumers.batching.builders.sft import SFTBuilder, SFTBuilderConfig
from consumers.errors import TrainerError
from consumers.training.config import TrainConfig
from consumers.training.executor import TrainingExecutor
from tests.support.trainer_data import golden_group


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from consumers.tiny_model import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny"))


def test_the_event_names_the_base_and_a_checkpoint_of_another_base_is_refused(base, tmp_path):
    from transformers import AutoTokenizer

    config = TrainConfig(base_model=str(base), learning_rate=5e-3)
    rows = SFTBuilder(SFTBuilderConfig(require_success=False)).build(golden_group())
    event = TrainingExecutor(config, tmp_path / "data").train_batch(rows, "sft", "b1")
    assert event.base_model_id == base_model_id(base) and len(event.base_model_id) == 16
    assert event.tokenizer_hash == tokenizer_hash(AutoTokenizer.from_pretrained(base), base)
    assert event.base_model == str(base)

    other = tmp_path / "other"  # the same shapes, another config: another base
    shutil.copytree(base, other)
    settings = json.loads((other / "config.json").read_text()) | {"rope_theta": 12345.0}
    (other / "config.json").write_text(json.dumps(settings))
    with pytest.raises(TrainerError, match=r"was trained on base_model_id '[0-9a-f]{16}', the configured"):
        TrainingExecutor(TrainConfig(base_model=str(other)), tmp_path / "data")
    resumed = TrainingExecutor(config, tmp_path / "data")  # its own base resumes
    assert resumed.state.policy_version == "v1"

"""Batch builder and executor options generated from their configs (written once), the batch-kind registry
they read, and the consumers error tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.batching.batch_writer import BatchStore
from consumers.batching.config import BatchBuilderConfig, PlannerConfig
from consumers.batching.kinds import DEFAULT_KINDS, KINDS, METHODS, follow_kind
from consumers.batching.planner import GroupLane, Planner
from consumers.errors import ConsumerConfigError, ConsumersError, SinkError, TrainerError
from consumers.sink.clickhouse import SinkUnavailable
from consumers.training.config import TrainRunConfig
from infra.cli.main import build_parser
from infra.options.configs import config_from_args
from infra.options.env import apply_env_defaults
from schemas.errors import AgentstreamError


def _parse(argv: list[str]):
    parser = build_parser()
    args = parser.parse_args(argv)
    apply_env_defaults(parser, args)
    return args


def _command(name: str):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "_command")
    return sub.choices[name]


@pytest.mark.parametrize("name", ["batch", "trainer", "train"])  # trainer: the old name of batch
def test_every_option_has_help_and_names_its_env_var(name):
    options = [a for a in _command(name)._actions if a.option_strings and a.dest != "help"]
    assert len(options) > 15
    for action in options:
        assert "[env AGENTSTREAM_" in action.help, action.option_strings


def test_trainer_flags_build_the_nested_configs():
    args = _parse(["batch", "--kinds", "dpo,grpo", "--dpo-max-pairs", "3", "--group-size", "6",
                   "--max-policy-lag", "2", "--no-require-success",
                   "--format", "parquet"])  # fmt: skip
    config = config_from_args(BatchBuilderConfig, args)
    assert config.planner.kinds == ("dpo", "grpo")
    assert config.planner.dpo.max_pairs_per_group == 3
    assert config.planner.grpo.max_policy_lag == 2
    assert config.planner.sft.require_success is False
    assert config.format == "parquet"
    # one group setting, used by every grouped lane (DPO and GRPO alike)
    planner = Planner(config.planner)
    assert {lane.collector.group_size for lane in planner.lanes.values() if isinstance(lane, GroupLane)} == {
        6
    }


def test_trainer_options_fall_back_to_their_env_vars(monkeypatch):
    monkeypatch.setenv("AGENTSTREAM_DPO_MAX_PAIRS", "5")
    monkeypatch.setenv("AGENTSTREAM_GROUP_TIMEOUT_S", "12.5")
    config = config_from_args(BatchBuilderConfig, _parse(["batch"]))
    assert config.planner.dpo.max_pairs_per_group == 5
    assert config.planner.groups.timeout_s == 12.5
    assert config.planner.kinds == DEFAULT_KINDS == ("sft", "dpo", "dpo_step", "grpo")


def test_train_flags_build_the_executor_config(tmp_path):
    args = _parse(["train", "--batch", str(tmp_path / "b.jsonl"), "--learning-rate", "0.01", "--no-lora"])
    run = config_from_args(TrainRunConfig, args)
    assert run.batch == tmp_path / "b.jsonl" and not run.follow
    assert run.train.learning_rate == 0.01 and run.train.lora is False


@pytest.mark.parametrize(
    ("build", "flag", "value"),
    [
        (lambda: PlannerConfig(kinds=("sft", "ppo")), "--kinds", "ppo"),
        (lambda: PlannerConfig(batch_trajectories=0), "--batch-trajectories", "0"),
        (lambda: BatchBuilderConfig(planner=PlannerConfig(kinds=("sft_tokenized",))),
         "--tokenizer", "sft_tokenized"),
        (lambda: TrainRunConfig(), "--follow", "--batch"),
        (lambda: TrainRunConfig(follow=True, batch=Path("x.jsonl")), "--follow", "x.jsonl"),
        (lambda: TrainRunConfig(follow=True, kinds=("rlhf",)), "--kinds", "rlhf"),
    ],
)  # fmt: skip
def test_invalid_options_name_the_flag_and_the_value(build, flag, value):
    with pytest.raises(ConsumerConfigError) as raised:
        build()
    assert flag in str(raised.value) and value in str(raised.value)


def test_registry_drives_methods_follow_defaults_and_batch_directories(tmp_path):
    assert METHODS == ("sft", "dpo", "grpo")
    assert [follow_kind(m) for m in METHODS] == ["sft", "dpo_step", "grpo"]
    assert TrainRunConfig(follow=True, method="dpo").follow_kinds() == ("dpo_step",)
    assert TrainRunConfig(follow=True).follow_kinds() == ("sft",)
    recovered = BatchStore(tmp_path).recover()
    assert set(recovered.trajectory_ids) == set(KINDS)
    assert sorted(p.name for p in (tmp_path / "batches").iterdir()) == sorted(KINDS)


def test_one_error_root_for_consumers():
    for error in (ConsumerConfigError, TrainerError, SinkError, SinkUnavailable):
        assert issubclass(error, ConsumersError)
    assert issubclass(ConsumersError, AgentstreamError)

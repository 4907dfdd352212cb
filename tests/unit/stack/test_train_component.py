"""`agentstream up --train`: the training executor is a supervised component, after the batch builder,
following training.batches for GRPO by default, with --train-args passed through."""

from __future__ import annotations

from infra.cli.main import build_parser
from infra.commands.stack import _stack_config
from infra.stack import components, embedded_config


def test_the_executor_runs_only_with_train_and_starts_after_the_batch_builder(tmp_path):
    assert "executor" not in [c.name for c in components(embedded_config(tmp_path))]
    names = [c.name for c in components(embedded_config(tmp_path, train=True, policy=True))]
    assert names.index("batch") < names.index("executor")
    [executor] = [c for c in components(embedded_config(tmp_path, train=True)) if c.name == "executor"]
    assert executor.args == ("train", "--follow", "--kinds", "grpo")


def test_train_args_are_split_and_passed_through(tmp_path):
    args = build_parser().parse_args(
        ["up", "--train", "--train-args", "--base-model tiny --kinds 'grpo,sft'", "--data-dir", str(tmp_path)]
    )
    config = _stack_config(args)
    assert config.train and config.train_args == ("--base-model", "tiny", "--kinds", "grpo,sft")
    [executor] = [c for c in components(config) if c.name == "executor"]
    assert executor.args[-4:] == ("--base-model", "tiny", "--kinds", "grpo,sft")
    train = build_parser().parse_args(list(executor.args))
    assert train.follow and train.kinds == "grpo,sft"  # the later --kinds wins

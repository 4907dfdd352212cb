"""`agentstream batch` and `agentstream train` (argument plumbing only).

- `batch`: the batch-building consumer of `trajectory.scored`; its options are generated from
  `consumers.batching.config.BatchBuilderConfig` (planner, SFT / DPO / GRPO builders, groups).
- `train`: the training executor, on one batch file or following `training.batches`; options from
  `consumers.training.config.TrainRunConfig` (with the executor's `TrainConfig`).

`trainer` is the old name of `batch`, kept for one release: it runs `batch` after a one-line note on
stderr. Adding an option to either is adding a documented field to its config. The work happens in
`consumers.batching.consumer.run_batch_builder` and `consumers.training.follow` (torch imported there).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import fields, replace
from pathlib import Path

from consumers.batching.config import BatchBuilderConfig
from consumers.errors import ConsumerConfigError
from consumers.training.config import TrainRunConfig
from infra.options.configs import add_config_options, config_from_args, config_to_argv
from infra.options.env import command_parser
from infra.runtime import agentstream_argv
from infra.terminal import output
from schemas.settings import Settings

BATCH_HELP = "build SFT / DPO / GRPO batches from trajectory.scored"
RENAMED = (
    "agentstream: `trainer` is now `batch` (it builds batches; `train` trains); "
    "the old name goes in the next release"
)


def register(sub) -> None:
    """Add `batch` (and its old name `trainer`) and `train` to the `agentstream` parser."""
    batch = command_parser(sub, "batch", run_batch, BATCH_HELP)
    add_config_options(batch, BatchBuilderConfig)
    old_name = command_parser(sub, "trainer", run_renamed_trainer, "old name of `batch` (deprecated)")
    add_config_options(old_name, BatchBuilderConfig)
    train = command_parser(
        sub, "train", run_train, "train on batches (LoRA): one file, or follow training.batches"
    )
    add_config_options(train, TrainRunConfig)


def _config(cls, args: argparse.Namespace):
    settings = Settings.from_args(args)
    try:
        return config_from_args(
            cls, args, bootstrap_servers=settings.bootstrap_servers, data_dir=settings.data_dir
        )
    except argparse.ArgumentTypeError as exc:  # a comma-separated list that does not parse
        raise ConsumerConfigError(str(exc)) from None


def run_batch(args: argparse.Namespace) -> int:
    from consumers.batching.consumer import run_batch_builder

    return run_batch_builder(_config(BatchBuilderConfig, args))


def run_renamed_trainer(args: argparse.Namespace) -> int:
    output.warn(RENAMED)
    return run_batch(args)


def run_train(args: argparse.Namespace) -> int:
    from infra.training_group import USAGE_EXIT, launched_rank

    if not launched_rank(os.environ):
        return _run_train(args)
    try:  # a rank: a usage error is the same on every restart, so it says so (exit 2: no restart)
        return _run_train(args)
    except ConsumerConfigError as exc:
        output.error(str(exc))
        return USAGE_EXIT


def _run_train(args: argparse.Namespace) -> int:
    from consumers.training.follow import follow, train_file
    from infra.training_gate import build_gate, check_gate_options
    from infra.training_group import check_restarts

    run = _config(TrainRunConfig, args)
    default = next(f.default for f in fields(TrainRunConfig) if f.name == "max_restarts")
    check_restarts(run.nproc, run.max_restarts, default, os.environ)
    check_gate_options(run)  # --gate's samples and task file, before a group is launched
    if run.nproc > 1:
        return launch_group(run, args.log_level or "INFO")
    gate = build_gate(run)  # --gate: the in-process held-out evaluator, injected (infra.training_gate)
    if run.follow:
        return follow(run, gate)
    event = train_file(run, gate)
    if os.environ.get("RANK", "0") != "0":
        return 0  # rank 0 says what the group made
    if event is None:
        output.say(f"{run.batch}: every GRPO group was over --max-staleness versions old; no new version")
        return 0
    loss = event.metrics["loss"]
    output.say(f"{event.policy_version}: {event.method} on {event.batch_ids[0]}, loss {loss:.4f}")
    output.say(f"checkpoint: {event.checkpoint_path}")
    if event.gate:
        figures = ", ".join(f"{k}={v:.4g}" for k, v in sorted(event.gate_figures.items()))
        output.say(f"gate: {event.gate} ({figures})")
    return 0


def launch_group(run: TrainRunConfig, log_level: str) -> int:
    """`--nproc N`: this process launches and supervises N ranks of the same run (infra.training_group)."""
    from consumers.training.follow import resolve_batch
    from infra.training_gate import base_model_dir, gate_expressions
    from infra.training_group import TrainingGroup, check_launch, check_nproc, nproc_limit

    check_launch(run.nproc, os.environ)
    check_nproc(run.nproc, *nproc_limit(run.train.device))
    # what every rank would refuse fails here once, not once per rank and restart
    if run.batch is not None:
        resolve_batch(run.batch, run.method)
    if run.gate:
        gate_expressions(Path(run.gate_tasks or ""))
    if run.train.base_model != "tiny":
        base_model_dir(run)
    group = TrainingGroup(rank_argv(run, log_level), run.nproc, run.max_restarts)
    return group.run()


def rank_argv(run: TrainRunConfig, log_level: str) -> list[str]:
    """The command each rank runs: this run with `--nproc 1` (its RANK / WORLD_SIZE come from the
    launcher's environment), the settings passed explicitly."""
    settings = ["--bootstrap-servers", run.bootstrap_servers, "--data-dir", str(run.data_dir)]
    options = config_to_argv(replace(run, nproc=1))
    return agentstream_argv("train", *settings, "--log-level", log_level, *options)

"""Subcommands contributed by this package (see infra/cli/main.py). Handlers are imported lazily.

- `agentstream trainer`: the batch-building consumer of `trajectory.scored` (consumers/trainer/consumer.py).
- `agentstream train`: the training executor, on one batch file or following `training.batches`.
"""

from __future__ import annotations

from consumers.trainer.commands import run_train, run_trainer
from infra.cli.options import add_option, command_parser


def register(sub) -> None:
    """Add this package's subcommands to the `agentstream` parser."""
    _register_trainer(sub)
    _register_train(sub)


def _register_trainer(sub) -> None:
    p = command_parser(
        sub,
        "trainer",
        run_trainer,
        "build SFT / DPO / GRPO batches from trajectory.scored",
    )
    add_option(
        p, "--kinds", default="sft,dpo,dpo_step,grpo", help="batch kinds: sft,sft_tokenized,dpo,dpo_step,grpo"
    )
    add_option(p, "--group-id", default="agentstream-trainer", help="Kafka consumer group (offsets)")
    add_option(
        p,
        "--batch-trajectories",
        type=int,
        default=64,
        help="flush a kind once this many trajectories are ready",
    )
    add_option(
        p, "--flush-interval-s", type=float, default=5.0, help="flush ready trajectories after this long"
    )
    add_option(p, "--format", choices=["jsonl", "parquet"], default="jsonl", help="batch file format")
    add_option(p, "--tokenizer", help="tokenizer directory, or 'tiny', for sft_tokenized rows")
    add_option(
        p, "--max-length", type=int, default=2048, help="tokens per pre-tokenized row (chunked at steps)"
    )
    add_option(
        p, "--chunk-context-steps", type=int, default=0, help="masked previous steps repeated per chunk"
    )
    add_option(
        p, "--require-success", action="store_true", default=True, help="SFT: only successful trajectories"
    )
    add_option(p, "--min-reward", type=float, help="SFT: only trajectories with at least this reward")
    add_option(p, "--curriculum", action="store_true", default=False, help="SFT: order rows easiest first")
    add_option(
        p,
        "--require-complete",
        action="store_true",
        default=True,
        help="skip trajectories with complete=false",
    )
    add_option(
        p, "--dedup", action="store_true", default=True, help="skip content duplicates (sha256 of steps)"
    )
    add_option(p, "--dpo-min-margin", type=float, default=0.05, help="DPO: minimum reward margin of a pair")
    add_option(
        p,
        "--dpo-strategy",
        choices=["best_vs_worst", "all_pairs"],
        default="best_vs_worst",
        help="DPO pairing",
    )
    add_option(p, "--dpo-max-pairs", type=int, default=8, help="DPO: pairs per task group at most")
    add_option(
        p,
        "--dpo-step-preference",
        choices=["trajectory", "process"],
        default="trajectory",
        help="step pairs: rank by",
    )
    add_option(p, "--group-size", type=int, default=4, help="GRPO/DPO: trajectories per group")
    add_option(
        p, "--min-group-size", type=int, default=2, help="GRPO/DPO: smallest group emitted after the timeout"
    )
    add_option(
        p, "--group-timeout-s", type=float, default=300.0, help="GRPO/DPO: wait this long for a full group"
    )
    add_option(p, "--estimator", choices=["grpo", "rloo"], default="grpo", help="GRPO advantage estimator")
    add_option(p, "--scale-rewards", action="store_true", default=True, help="GRPO: divide by the group std")
    add_option(
        p,
        "--step-advantage",
        choices=["none", "process_return", "mixed"],
        default="none",
        help="GRPO step advantages",
    )
    add_option(p, "--gamma", type=float, default=1.0, help="GRPO: discount of process-reward returns")
    add_option(
        p, "--max-policy-lag", type=int, help="GRPO: drop trajectories more than N policy versions old"
    )
    add_option(p, "--horizon-steps", help="GRPO: horizon schedule, e.g. 8,12,15 (steps per trajectory)")
    add_option(p, "--horizon-interval", type=int, default=100, help="GRPO: training steps per horizon stage")
    add_option(p, "--idle-exit-s", type=float, help="exit after this long idle with nothing due (backfills)")


def _register_train(sub) -> None:
    p = command_parser(
        sub,
        "train",
        run_train,
        "train on batches (LoRA): one file, or follow training.batches",
    )
    add_option(
        p, "--follow", action="store_true", default=False, help="consume training.batches and train on each"
    )
    add_option(p, "--batch", help="a batch file (.jsonl/.parquet) or its manifest")
    add_option(p, "--method", choices=["sft", "dpo", "grpo"], help="default: from the batch kind")
    add_option(
        p, "--kinds", help="--follow: batch kinds to train on (default: sft, dpo_step or grpo per --method)"
    )
    add_option(p, "--base-model", default="tiny", help="local model directory, or 'tiny' (built locally)")
    add_option(p, "--learning-rate", type=float, default=2e-4, help="AdamW learning rate")
    add_option(p, "--epochs", type=int, default=1, help="passes over each batch")
    add_option(p, "--micro-batch-size", type=int, default=4, help="rows per forward pass")
    add_option(
        p, "--gradient-accumulation-steps", type=int, default=1, help="micro batches per optimizer step"
    )
    add_option(p, "--max-length", type=int, default=1024, help="tokens per row at most")
    add_option(
        p, "--lora", action="store_true", default=True, help="train a LoRA adapter (false: full fine-tune)"
    )
    add_option(p, "--lora-r", type=int, default=8, help="LoRA rank")
    add_option(p, "--lora-alpha", type=int, default=16, help="LoRA alpha")
    add_option(p, "--beta", type=float, default=0.1, help="DPO beta")
    add_option(p, "--clip-epsilon", type=float, default=0.2, help="GRPO ratio clip")
    add_option(
        p, "--kl-beta", type=float, default=0.0, help="GRPO k3 KL weight against the adapter-disabled model"
    )
    add_option(
        p,
        "--step-weighted-loss",
        action="store_true",
        default=False,
        help="SFT: weight steps by process reward",
    )
    add_option(p, "--device", help="cuda / cpu (default: cuda when available)")
    add_option(p, "--publish", action="store_true", default=True, help="publish policy.updated")
    add_option(p, "--group-id", default="agentstream-executor", help="--follow: Kafka consumer group")
    add_option(p, "--idle-exit-s", type=float, help="--follow: exit after this long without batches")

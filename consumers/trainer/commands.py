"""CLI handlers of `agentstream trainer` and `agentstream train` (argument plumbing only)."""

from __future__ import annotations

import logging
from pathlib import Path

from consumers.trainer.errors import TrainerError
from schemas.settings import Settings

log = logging.getLogger(__name__)

# `train --follow` trains one method per adapter by default: plain SFT rows, step-level DPO pairs
# (observations never in the completion), GRPO groups.
DEFAULT_FOLLOW_KIND = {"sft": "sft", "dpo": "dpo_step", "grpo": "grpo"}


def _csv(text: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (text or "").split(",") if p.strip())


def planner_config(args):
    from consumers.trainer.builders.dpo import DPOPairConfig
    from consumers.trainer.builders.grpo import GRPOGroupConfig
    from consumers.trainer.builders.sft import SFTBuilderConfig
    from consumers.trainer.planner import PlannerConfig

    kinds = _csv(args.kinds)
    unknown = set(kinds) - {"sft", "sft_tokenized", "dpo", "dpo_step", "grpo"}
    if unknown:
        raise TrainerError(
            f"--kinds: unknown kind(s) {sorted(unknown)} (known: sft,sft_tokenized,dpo,dpo_step,grpo)"
        )
    try:
        horizon = tuple(int(x) for x in _csv(args.horizon_steps))
    except ValueError:
        raise TrainerError(
            f"--horizon-steps: expected integers like 8,12,15, got {args.horizon_steps!r}"
        ) from None
    group = {
        "group_size": args.group_size,
        "min_group_size": args.min_group_size,
        "timeout_s": args.group_timeout_s,
    }
    return PlannerConfig(
        kinds=kinds,
        batch_trajectories=args.batch_trajectories,
        flush_interval_s=args.flush_interval_s,
        require_complete=args.require_complete,
        dedup=args.dedup,
        sft=SFTBuilderConfig(
            require_success=args.require_success,
            min_reward=args.min_reward,
            curriculum=args.curriculum,
            max_length=args.max_length,
            chunk_context_steps=args.chunk_context_steps,
        ),
        dpo=DPOPairConfig(
            min_margin=args.dpo_min_margin,
            strategy=args.dpo_strategy,
            max_pairs_per_group=args.dpo_max_pairs,
            step_preference=args.dpo_step_preference,
            **group,
        ),
        grpo=GRPOGroupConfig(
            estimator=args.estimator,
            scale_rewards=args.scale_rewards,
            step_advantage=args.step_advantage,
            gamma=args.gamma,
            max_policy_lag=args.max_policy_lag,
            horizon_steps=horizon,
            horizon_interval=args.horizon_interval,
            **group,
        ),
    )


def load_tokenizer(spec: str | None, data_dir: Path):
    if not spec:
        return None
    from transformers import AutoTokenizer

    from consumers.trainer.tiny import tiny_model_dir

    path = tiny_model_dir(data_dir) if spec == "tiny" else Path(spec)
    if not path.exists():
        raise TrainerError(f"--tokenizer: {spec!r} is not a local directory (or 'tiny')")
    return AutoTokenizer.from_pretrained(path)


def run_trainer(args) -> int:
    from consumers.trainer.consumer import ConsumerOptions, TrainerConsumer

    settings = Settings.from_args(args)
    config = planner_config(args)
    tokenizer = load_tokenizer(args.tokenizer, settings.data_dir)
    if "sft_tokenized" in config.kinds and tokenizer is None:
        raise TrainerError("--kinds: sft_tokenized needs --tokenizer PATH|tiny")
    options = ConsumerOptions(
        bootstrap_servers=settings.bootstrap_servers,
        data_dir=settings.data_dir,
        group_id=args.group_id,
        format=args.format,
        idle_exit_s=args.idle_exit_s,
    )
    return TrainerConsumer(options, config, tokenizer).run()


def train_config(args):
    from consumers.trainer.executor import TrainConfig

    return TrainConfig(
        base_model=args.base_model,
        learning_rate=args.learning_rate,
        epochs=args.epochs,
        micro_batch_size=args.micro_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        max_length=args.max_length,
        lora=args.lora,
        lora_r=args.lora_r,
        lora_alpha=args.lora_alpha,
        beta=args.beta,
        clip_epsilon=args.clip_epsilon,
        kl_beta=args.kl_beta,
        step_weighted_loss=args.step_weighted_loss,
        device=args.device,
    )


def run_train(args) -> int:
    from consumers.trainer.follow import follow, train_file

    settings = Settings.from_args(args)
    if bool(args.follow) == bool(args.batch):
        raise TrainerError("train: give exactly one of --follow or --batch PATH")
    config = train_config(args)
    if args.batch:
        event = train_file(config, settings, Path(args.batch), args.method, publish=args.publish)
        loss = event.metrics["loss"]
        print(f"{event.policy_version}: {event.method} on {event.batch_ids[0]}, loss {loss:.4f}")
        print(f"checkpoint: {event.checkpoint_path}")
        return 0
    kinds = _csv(args.kinds) or (DEFAULT_FOLLOW_KIND[args.method or "sft"],)
    return follow(config, settings, kinds, args.group_id, args.idle_exit_s)

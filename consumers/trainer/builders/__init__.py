"""Pure batch builders: scored trajectories in, training rows out. No I/O, no clocks (time is passed in)."""

from consumers.trainer.builders.common import Source, reward_of
from consumers.trainer.builders.dpo import DPOPairBuilder, DPOPairConfig, StepPairBuilder
from consumers.trainer.builders.grpo import GRPOGroupBuilder, GRPOGroupConfig
from consumers.trainer.builders.sft import SFTBuilder, SFTBuilderConfig

__all__ = [
    "DPOPairBuilder",
    "DPOPairConfig",
    "GRPOGroupBuilder",
    "GRPOGroupConfig",
    "SFTBuilder",
    "SFTBuilderConfig",
    "Source",
    "StepPairBuilder",
    "reward_of",
]

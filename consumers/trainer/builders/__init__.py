"""Pure batch builders: scored trajectories in, training rows out. No I/O, no clocks (time is passed in).

Which builder makes which batch kind is `consumers/trainer/kinds.py`.
"""

from consumers.trainer.builders.common import reward_of
from consumers.trainer.builders.dpo import DPOPairBuilder, DPOPairConfig, StepPairBuilder
from consumers.trainer.builders.groups import GroupConfig
from consumers.trainer.builders.grpo import GRPOGroupBuilder, GRPOGroupConfig
from consumers.trainer.builders.sft import SFTBuilder, SFTBuilderConfig

__all__ = [
    "DPOPairBuilder",
    "DPOPairConfig",
    "GRPOGroupBuilder",
    "GRPOGroupConfig",
    "GroupConfig",
    "SFTBuilder",
    "SFTBuilderConfig",
    "StepPairBuilder",
    "reward_of",
]

"""Pure batch builders: scored trajectories in, training rows out. No I/O, no clocks (time is passed in).

Which builder makes which batch kind is `consumers/batching/kinds.py`.
"""

from consumers.batching.builders.common import reward_of
from consumers.batching.builders.dpo import DPOPairBuilder, DPOPairConfig, StepPairBuilder
from consumers.batching.builders.groups import GroupConfig
from consumers.batching.builders.grpo import GRPOGroupBuilder, GRPOGroupConfig
from consumers.batching.builders.sft import SFTBuilder, SFTBuilderConfig

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

"""The batch builder's settings, TRL style: one documented field per option.

`agentstream batch` is generated from `BatchBuilderConfig` (which nests `PlannerConfig`, which nests
the SFT / DPO / GRPO builder configs and the `GroupConfig` DPO and GRPO share): adding an option is
adding a field with `option(default, help)` (schemas.config_fields). Validation is in `__post_init__`
and names the option and the value. Nothing here reads the environment or imports torch. The
executor's settings (`agentstream train`) are in `consumers.training.config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from clients.fetch_pacing import max_wait_option, min_bytes_option
from consumers.batching.builders.dpo import DPOPairConfig
from consumers.batching.builders.groups import GroupConfig
from consumers.batching.builders.grpo import GRPOGroupConfig
from consumers.batching.builders.sft import SFTBuilderConfig
from consumers.batching.kinds import DEFAULT_KINDS, KINDS, unknown_kinds
from consumers.errors import ConsumerConfigError
from schemas.config_fields import check_bounds, option
from schemas.settings import DEFAULT_BOOTSTRAP
from schemas.versions import LIVE_RULES_VERSION

_KNOWN = ",".join(KINDS)


def check_kinds(kinds: tuple[str, ...], flag: str = "--kinds") -> None:
    """Raise naming `flag` and every unknown kind (shared by `batch --kinds` and `train --kinds`)."""
    unknown = unknown_kinds(kinds)
    if unknown:
        raise ConsumerConfigError(f"{flag}: unknown kind(s) {unknown} (known: {_KNOWN})")


@dataclass(frozen=True)
class PlannerConfig:
    """Which batches the batch builder builds and when it flushes them."""

    kinds: tuple[str, ...] = option(DEFAULT_KINDS, f"batch kinds, comma-separated: {_KNOWN}")
    batch_trajectories: int = option(64, "flush a kind once this many trajectories are ready", ge=1)
    flush_interval_s: float = option(5.0, "flush ready trajectories after this long", ge=0)
    require_complete: bool = option(True, "skip trajectories with complete=false")
    reward_version: str = option(
        LIVE_RULES_VERSION,
        "build batches only from trajectory.scored of this reward version: a rules version "
        "(rules-2 takes assembly-1+rules-2) or a whole one, or 'any'. The default follows the live "
        "stack: AGENTSTREAM_REWARD_VERSION is also what the live rule workers stamp "
        "(docs/reward-versions.md)",
    )
    dedup: bool = option(True, "skip content duplicates (sha256 of steps)")
    group_definition_wait_s: float = option(
        60.0,
        "GRPO/DPO: a group whose members were scored under different reward definitions "
        "(e.g. some without the judge layer) waits this long for later revisions to agree, then is "
        "built from the members of its most common definition; the others are left out and counted "
        "(docs/reward-definitions.md)",
        ge=0,
    )
    sft: SFTBuilderConfig = field(default_factory=SFTBuilderConfig, metadata={"prefix": ""})
    dpo: DPOPairConfig = field(default_factory=DPOPairConfig, metadata={"prefix": "dpo-"})
    grpo: GRPOGroupConfig = field(default_factory=GRPOGroupConfig, metadata={"prefix": ""})
    groups: GroupConfig = field(default_factory=GroupConfig, metadata={"prefix": ""})

    def __post_init__(self):
        check_kinds(self.kinds)
        if not self.kinds:
            raise ConsumerConfigError(f"--kinds: give at least one kind (known: {_KNOWN})")
        check_bounds(self, ConsumerConfigError)
        if not self.reward_version.strip():
            raise ConsumerConfigError("--reward-version: give a version like rules-1, or 'any', got ''")


@dataclass(frozen=True)
class BatchBuilderConfig:
    """Everything `agentstream batch` needs, read once from the command line / environment."""

    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    data_dir: Path = Path(".agentstream")
    group_id: str = option("agentstream-trainer", "Kafka consumer group (offsets)")
    format: Literal["jsonl", "parquet"] = option("jsonl", "batch file format")
    tokenizer: str | None = option(None, "tokenizer directory, or 'tiny', for sft_tokenized rows")
    base_model: str = option(
        "tiny",
        "the training base: a local model directory, or 'tiny'; GRPO leaves out steps recorded under "
        "another tokenizer. One setting with `agentstream policy` and `agentstream train` "
        "(docs/operations.md, One base model)",
    )
    idle_exit_s: float | None = option(None, "exit after this long idle with nothing due (backfills)")
    poll_timeout_ms: int = 200
    max_records: int = 500
    fetch_min_bytes: int = min_bytes_option(256 * 1024)
    fetch_max_wait_ms: int = max_wait_option(500)
    planner: PlannerConfig = field(default_factory=PlannerConfig, metadata={"prefix": ""})

    def __post_init__(self):
        check_bounds(self, ConsumerConfigError)
        needing = [k for k in self.planner.kinds if KINDS[k].needs_tokenizer]
        if needing and not self.tokenizer:
            raise ConsumerConfigError(f"--kinds: {', '.join(needing)} needs --tokenizer PATH|tiny")

"""The batch builder's settings, TRL style: one documented field per option.

`agentstream batch` is generated from `BatchBuilderConfig` (which nests `PlannerConfig`, which nests
the SFT / DPO / GRPO builder configs and the `GroupConfig` DPO and GRPO share): adding an option is
adding a field with `metadata={"help": ...}`. Validation is in `__post_init__` and names the option
and the value. Nothing here reads the environment or imports torch. The executor's settings
(`agentstream train`) are in `consumers.training.config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from consumers.batching.builders.dpo import DPOPairConfig
from consumers.batching.builders.groups import GroupConfig
from consumers.batching.builders.grpo import GRPOGroupConfig
from consumers.batching.builders.sft import SFTBuilderConfig
from consumers.batching.kinds import DEFAULT_KINDS, KINDS, unknown_kinds
from consumers.errors import ConsumerConfigError
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

    kinds: tuple[str, ...] = field(
        default=DEFAULT_KINDS, metadata={"help": f"batch kinds, comma-separated: {_KNOWN}"}
    )
    batch_trajectories: int = field(
        default=64, metadata={"help": "flush a kind once this many trajectories are ready"}
    )
    flush_interval_s: float = field(
        default=5.0, metadata={"help": "flush ready trajectories after this long"}
    )
    require_complete: bool = field(default=True, metadata={"help": "skip trajectories with complete=false"})
    reward_version: str = field(
        default=LIVE_RULES_VERSION,
        metadata={
            "help": "build batches only from trajectory.scored of this reward version: a rules version "
            "(rules-2 takes assembly-1+rules-2) or a whole one, or 'any'. The default follows the live "
            "stack: AGENTSTREAM_REWARD_VERSION is also what the live rule workers stamp "
            "(docs/reward-versions.md)"
        },
    )
    dedup: bool = field(default=True, metadata={"help": "skip content duplicates (sha256 of steps)"})
    group_definition_wait_s: float = field(
        default=60.0,
        metadata={
            "help": "GRPO/DPO: a group whose members were scored under different reward definitions "
            "(e.g. some without the judge layer) waits this long for later revisions to agree, then is "
            "built from the members of its most common definition; the others are left out and counted "
            "(docs/reward-definitions.md)"
        },
    )
    sft: SFTBuilderConfig = field(default_factory=SFTBuilderConfig, metadata={"prefix": ""})
    dpo: DPOPairConfig = field(default_factory=DPOPairConfig, metadata={"prefix": "dpo-"})
    grpo: GRPOGroupConfig = field(default_factory=GRPOGroupConfig, metadata={"prefix": ""})
    groups: GroupConfig = field(default_factory=GroupConfig, metadata={"prefix": ""})

    def __post_init__(self):
        check_kinds(self.kinds)
        if not self.kinds:
            raise ConsumerConfigError(f"--kinds: give at least one kind (known: {_KNOWN})")
        if self.batch_trajectories < 1:
            raise ConsumerConfigError(f"--batch-trajectories: must be >= 1, got {self.batch_trajectories!r}")
        if self.flush_interval_s < 0:
            raise ConsumerConfigError(f"--flush-interval-s: must be >= 0, got {self.flush_interval_s!r}")
        if not self.reward_version.strip():
            raise ConsumerConfigError("--reward-version: give a version like rules-1, or 'any', got ''")
        if self.group_definition_wait_s < 0:
            raise ConsumerConfigError(
                f"--group-definition-wait-s: must be >= 0, got {self.group_definition_wait_s!r}"
            )


@dataclass(frozen=True)
class BatchBuilderConfig:
    """Everything `agentstream batch` needs, read once from the command line / environment."""

    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    data_dir: Path = Path(".agentstream")
    group_id: str = field(default="agentstream-trainer", metadata={"help": "Kafka consumer group (offsets)"})
    format: Literal["jsonl", "parquet"] = field(default="jsonl", metadata={"help": "batch file format"})
    tokenizer: str | None = field(
        default=None, metadata={"help": "tokenizer directory, or 'tiny', for sft_tokenized rows"}
    )
    idle_exit_s: float | None = field(
        default=None, metadata={"help": "exit after this long idle with nothing due (backfills)"}
    )
    poll_timeout_ms: int = 200
    max_records: int = 500
    fetch_min_bytes: int = field(
        default=256 * 1024,
        metadata={"help": "the broker answers a fetch once this many bytes are ready, or after the wait"},
    )
    fetch_max_wait_ms: int = field(
        default=500, metadata={"help": "longest the broker holds a fetch waiting for --fetch-min-bytes"}
    )
    planner: PlannerConfig = field(default_factory=PlannerConfig, metadata={"prefix": ""})

    def __post_init__(self):
        if self.fetch_min_bytes < 1 or self.fetch_max_wait_ms < 0:
            raise ConsumerConfigError(
                "--fetch-min-bytes / --fetch-max-wait-ms: must be >= 1 / >= 0, "
                f"got {self.fetch_min_bytes!r} / {self.fetch_max_wait_ms!r}"
            )
        needing = [k for k in self.planner.kinds if KINDS[k].needs_tokenizer]
        if needing and not self.tokenizer:
            raise ConsumerConfigError(f"--kinds: {', '.join(needing)} needs --tokenizer PATH|tiny")

"""`agentstream export`'s options, one documented field each (the CLI is generated from them).

Validation is in `__post_init__` and names the option and the value; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from infra.export.errors import ExportError
from infra.export.splits import parse_fractions

KINDS: tuple[str, ...] = ("sft", "dpo", "dpo_step", "grpo")
"""The kinds with a TRL row format (`sft_tokenized` rows are tokenizer-specific: not exported)."""
SOURCES: tuple[str, ...] = ("clickhouse", "batches")
FORMATS: tuple[str, ...] = ("jsonl", "parquet", "hf")


@dataclass(frozen=True)
class ExportConfig:
    """What one export does."""

    kind: Literal["sft", "dpo", "dpo_step", "grpo"] = field(
        default="sft",
        metadata={
            "env": "AGENTSTREAM_EXPORT_KIND",
            "help": "dataset kind: sft, dpo (trajectory pairs), dpo_step, grpo",
        },
    )
    source: Literal["clickhouse", "batches"] = field(
        default="clickhouse",
        metadata={
            "env": "AGENTSTREAM_EXPORT_SOURCE",
            "help": "clickhouse: build rows from scored trajectories; batches: the trainer's files",
        },
    )
    format: Literal["jsonl", "parquet", "hf"] = field(
        default="jsonl",
        metadata={
            "flag": "--format",
            "env": "AGENTSTREAM_EXPORT_FORMAT",
            "help": "jsonl, parquet, or hf (a Hub-style directory: data/<split>-*.parquet + card)",
        },
    )
    out: Path | None = field(
        default=None, metadata={"env": "AGENTSTREAM_EXPORT_OUT", "help": "output directory (created)"}
    )
    split: str = field(
        default="0.8,0.1,0.1",
        metadata={
            "env": "AGENTSTREAM_EXPORT_SPLIT",
            "help": "train,validation,test fractions (split by task id)",
        },
    )
    seed: int = field(
        default=0,
        metadata={
            "env": "AGENTSTREAM_EXPORT_SEED",
            "help": "split salt: a task keeps its split across exports",
        },
    )
    reward_versions: tuple[str, ...] = field(
        default=(),
        metadata={
            "flag": "--reward-version",
            "env": "AGENTSTREAM_EXPORT_REWARD_VERSION",
            "help": "only data scored with these reward versions (comma-separated; default: all)",
        },
    )
    min_reward: float | None = field(
        default=None,
        metadata={
            "env": "AGENTSTREAM_EXPORT_MIN_REWARD",
            "help": "SFT: only trajectories with at least this reward",
        },
    )
    require_success: bool = field(
        default=True,
        metadata={"env": "AGENTSTREAM_EXPORT_REQUIRE_SUCCESS", "help": "SFT: only successful trajectories"},
    )

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ExportError(f"--kind: one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.source not in SOURCES:
            raise ExportError(f"--source: one of {', '.join(SOURCES)}, got {self.source!r}")
        if self.format not in FORMATS:
            raise ExportError(f"--format: one of {', '.join(FORMATS)}, got {self.format!r}")
        parse_fractions(self.split)

    @property
    def fractions(self) -> tuple[float, float, float]:
        return parse_fractions(self.split)

    def to_dict(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}

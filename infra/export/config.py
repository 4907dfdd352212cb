"""`agentstream export`'s options, one documented field each (the CLI is generated from them).

Validation is in `__post_init__` and names the option and the value; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from infra.export.errors import ExportError
from infra.export.splits import parse_fractions
from schemas.config_fields import option

KINDS: tuple[str, ...] = ("sft", "dpo", "dpo_step", "grpo")
"""The kinds with a TRL row format (`sft_tokenized` rows are tokenizer-specific: not exported)."""
SOURCES: tuple[str, ...] = ("clickhouse", "batches")
FORMATS: tuple[str, ...] = ("jsonl", "parquet", "hf")


@dataclass(frozen=True)
class ExportConfig:
    """What one export does."""

    kind: Literal["sft", "dpo", "dpo_step", "grpo"] = option(
        "sft", "dataset kind: sft, dpo (trajectory pairs), dpo_step, grpo", env="AGENTSTREAM_EXPORT_KIND"
    )
    source: Literal["clickhouse", "batches"] = option(
        "clickhouse",
        "clickhouse: build rows from scored trajectories; batches: the trainer's files",
        env="AGENTSTREAM_EXPORT_SOURCE",
    )
    format: Literal["jsonl", "parquet", "hf"] = option(
        "jsonl",
        "jsonl, parquet, or hf (a Hub-style directory: data/<split>-*.parquet + card)",
        flag="--format",
        env="AGENTSTREAM_EXPORT_FORMAT",
    )
    out: Path | None = option(None, "output directory (created)", env="AGENTSTREAM_EXPORT_OUT")
    split: str = option(
        "0.8,0.1,0.1", "train,validation,test fractions (split by task id)", env="AGENTSTREAM_EXPORT_SPLIT"
    )
    seed: int = option(0, "split salt: a task keeps its split across exports", env="AGENTSTREAM_EXPORT_SEED")
    reward_versions: tuple[str, ...] = option(
        (),
        "only data scored with these reward versions (comma-separated; default: all)",
        flag="--reward-version",
        env="AGENTSTREAM_EXPORT_REWARD_VERSION",
    )
    min_reward: float | None = option(
        None, "SFT: only trajectories with at least this reward", env="AGENTSTREAM_EXPORT_MIN_REWARD"
    )
    require_success: bool = option(
        True, "SFT: only successful trajectories", env="AGENTSTREAM_EXPORT_REQUIRE_SUCCESS"
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

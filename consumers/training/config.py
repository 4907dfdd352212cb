"""The training executor's settings, TRL style: one documented field per option.

`agentstream train` is generated from `TrainRunConfig` (which nests the executor's `TrainConfig`):
adding an option is adding a field with `metadata={"help": ...}`. Validation is in `__post_init__`
and names the option and the value. Nothing here reads the environment or imports torch. The batch
kinds (`--kinds`, the method per kind) are the batch builder's (`consumers.batching.kinds`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from consumers.batching.config import check_kinds
from consumers.batching.kinds import METHODS, follow_kind
from consumers.errors import ConsumerConfigError
from consumers.training.batch_rows import DEFAULT_MAX_ASSEMBLY_MB
from schemas.settings import DEFAULT_BOOTSTRAP


@dataclass(frozen=True)
class TrainConfig:
    """Executor hyperparameters (TRL-style config)."""

    base_model: str = field(
        default="tiny",
        metadata={
            "help": "local model directory, or 'tiny' (built locally, no download); one setting with "
            "`agentstream policy` and `agentstream batch` (docs/operations.md, One base model)",
            "env": "AGENTSTREAM_BASE_MODEL",
        },
    )
    learning_rate: float = field(default=2e-4, metadata={"help": "AdamW learning rate"})
    epochs: int = field(default=1, metadata={"help": "passes over each batch"})
    micro_batch_size: int = field(default=4, metadata={"help": "rows per forward pass"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro batches per optimizer step"})
    max_length: int = field(
        default=1024,
        metadata={
            "help": "tokens per row at most: a longer row (a DPO pair with either side longer) is left "
            "out of the update and counted (rows_over_max_length), never cut"
        },
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata={
            "help": "recompute activations in the backward pass: less memory for longer rows, about a "
            "third more compute"
        },
    )
    lora: bool = field(default=True, metadata={"help": "train a LoRA adapter (false: full fine-tune)"})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank"})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha"})
    lora_dropout: float = 0.0
    target_modules: str = "all-linear"
    beta: float = field(default=0.1, metadata={"help": "DPO beta"})
    clip_epsilon: float = field(default=0.2, metadata={"help": "GRPO ratio clip"})
    kl_beta: float = field(
        default=0.0,
        metadata={"help": "GRPO k3 KL weight against --reference (0: no KL term; TRL's default is 0 too)"},
    )
    reference: str = field(
        default="base",
        metadata={
            "help": "KL reference: base (the model before any update) or a policy version like v3 "
            "whose checkpoint is loaded"
        },
    )
    is_correction: Literal["tis", "none"] = field(
        default="tis",
        metadata={
            "help": "GRPO off-policy correction: tis (token-level truncated importance sampling "
            "between the sampling policy and the weights trained) or none"
        },
    )
    is_truncation: float = field(default=2.0, metadata={"help": "GRPO: TIS weights are capped at this"})
    max_staleness: int = field(
        default=2,
        metadata={
            "help": "GRPO: drop whole groups sampled more than N versions before the weights being trained"
        },
    )
    lr_schedule: Literal["cosine", "constant"] = field(
        default="cosine", metadata={"help": "learning rate after warmup: cosine decay or constant"}
    )
    warmup_steps: int = field(default=0, metadata={"help": "optimizer steps of linear warmup"})
    schedule_steps: int = field(
        default=1000, metadata={"help": "optimizer steps of the cosine period (then the floor)"}
    )
    min_lr_ratio: float = field(
        default=0.1, metadata={"help": "cosine floor as a fraction of --learning-rate"}
    )
    step_weighted_loss: bool = field(default=False, metadata={"help": "SFT: weight steps by process reward"})
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    seed: int = field(
        default=0,
        metadata={
            "help": "seed of the adapter's initialisation (AGENTSTREAM_SEED, shared with `rollout --seed`)"
        },
    )
    device: str | None = field(default=None, metadata={"help": "cuda / cpu (default: cuda when available)"})

    def __post_init__(self):
        if self.learning_rate <= 0:
            raise ConsumerConfigError(f"--learning-rate: must be > 0, got {self.learning_rate!r}")
        for flag, value in (
            ("--epochs", self.epochs),
            ("--micro-batch-size", self.micro_batch_size),
            ("--gradient-accumulation-steps", self.gradient_accumulation_steps),
            ("--max-length", self.max_length),
            ("--lora-r", self.lora_r),
        ):
            if value < 1:
                raise ConsumerConfigError(f"{flag}: must be >= 1, got {value!r}")
        self._check_offpolicy()

    def _check_offpolicy(self) -> None:
        if self.is_truncation < 1:
            raise ConsumerConfigError(f"--is-truncation: must be >= 1, got {self.is_truncation!r}")
        if self.kl_beta < 0:
            raise ConsumerConfigError(f"--kl-beta: must be >= 0, got {self.kl_beta!r}")
        for flag, value in (("--max-staleness", self.max_staleness), ("--warmup-steps", self.warmup_steps)):
            if value < 0:
                raise ConsumerConfigError(f"{flag}: must be >= 0, got {value!r}")
        if self.schedule_steps < 1:
            raise ConsumerConfigError(f"--schedule-steps: must be >= 1, got {self.schedule_steps!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConsumerConfigError(f"--min-lr-ratio: must be in [0, 1], got {self.min_lr_ratio!r}")
        if not self.reference:
            raise ConsumerConfigError("--reference: give base or a policy version like v3, got ''")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TrainRunConfig:
    """What one `agentstream train` run does: one batch file, or follow `training.batches`."""

    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    data_dir: Path = Path(".agentstream")
    follow: bool = field(default=False, metadata={"help": "consume training.batches and train on each"})
    batch: Path | None = field(
        default=None, metadata={"help": "a batch file (.jsonl/.parquet) or its manifest"}
    )
    method: str | None = field(
        default=None, metadata={"help": "default: from the batch kind", "choices": METHODS}
    )
    kinds: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "--follow: batch kinds to train on (default: "
            + ", ".join(f"{follow_kind(m)} for {m}" for m in METHODS)
            + ", per --method; sft without it)"
        },
    )
    publish: bool = field(default=True, metadata={"help": "publish policy.updated"})
    group_id: str = field(default="agentstream-executor", metadata={"help": "--follow: Kafka consumer group"})
    idle_exit_s: float | None = field(
        default=None, metadata={"help": "--follow: exit after this long without batches"}
    )
    max_assembly_mb: int = field(
        default=DEFAULT_MAX_ASSEMBLY_MB,
        metadata={
            "help": "--follow: MB of batch.rows chunks held while assembling batches (as received; "
            "decoded rows take about 4x). A batch larger than this is refused (BatchTooLarge); past "
            "it the oldest unfinished batch is set aside and its chunks read again from the log when "
            "its batch.built comes"
        },
    )
    nproc: int = field(
        default=1,
        metadata={
            "help": "training processes (ranks) on this machine, launched and supervised as one group "
            "(gloo on CPU, nccl on CUDA); under torchrun or accelerate leave it 1"
        },
    )
    max_restarts: int = field(
        default=3,
        metadata={"help": "--nproc: restarts of the whole group after a rank fails, before giving up"},
    )
    gate: bool = field(
        default=False,
        metadata={
            "help": "evaluation gate: before publishing a version, play --gate-tasks with it and with the "
            "version serving now (paired seeds) and refuse it when significantly worse (one-sided "
            "exact McNemar at --gate-alpha); a refused version is published but never served"
        },
    )
    gate_tasks: Path | None = field(
        default=None,
        metadata={"help": "--gate: held-out calc tasks, a task file (JSON Lines, as `agentstream rollout`)"},
    )
    gate_samples: int = field(
        default=4, metadata={"help": "--gate: sampled episodes per task and version (plus one greedy)"}
    )
    gate_alpha: float = field(
        default=0.05, metadata={"help": "--gate: refuse when the one-sided McNemar p is below this"}
    )
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"prefix": ""})

    def __post_init__(self):
        if self.nproc < 1:
            raise ConsumerConfigError(f"train: --nproc must be at least 1, got {self.nproc}")
        if self.max_restarts < 0:
            raise ConsumerConfigError(f"train: --max-restarts must be 0 or more, got {self.max_restarts}")
        if self.follow == (self.batch is not None):
            raise ConsumerConfigError(
                f"train: give exactly one of --follow or --batch PATH (got --follow {self.follow}, "
                f"--batch {str(self.batch) if self.batch else None!r})"
            )
        if self.max_assembly_mb < 1:
            raise ConsumerConfigError(f"--max-assembly-mb: must be >= 1, got {self.max_assembly_mb!r}")
        check_kinds(self.kinds)
        self._check_gate()

    def _check_gate(self) -> None:
        if self.gate and self.gate_tasks is None:
            raise ConsumerConfigError("--gate: give the held-out tasks with --gate-tasks FILE")
        if self.gate_samples < 1:
            raise ConsumerConfigError(f"--gate-samples: must be >= 1, got {self.gate_samples!r}")
        if not 0 < self.gate_alpha < 1:
            raise ConsumerConfigError(f"--gate-alpha: must be in (0, 1), got {self.gate_alpha!r}")

    def follow_kinds(self) -> tuple[str, ...]:
        """The kinds `--follow` trains on: `--kinds`, else the default kind of `--method` (sft)."""
        return self.kinds or (follow_kind(self.method or "sft"),)

"""The training loop's events: `training.batches` (a batch file was written) and `policy.updates`
(a training step produced a new policy version)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.bounded import Count, Id, JsonDict
from schemas.events.envelope import EventBase


class BatchBuilt(EventBase):
    """A training batch file was written. `trajectory_id` carries the batch id (the topic key)."""

    type: Literal["batch.built"] = "batch.built"
    batch_id: str
    kind: Literal["sft", "sft_tokenized", "dpo", "dpo_step", "grpo"]
    path: str
    format: Literal["jsonl", "parquet"] = "jsonl"
    row_count: Count
    trajectory_ids: list[str] = Field(default_factory=list)
    source_offsets: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="topic -> partition -> next offset covered by this batch"
    )
    source_ranges: dict[str, dict[str, list[int]]] = Field(
        default_factory=dict,
        description="topic -> partition -> [first, last] offset of the records this batch was built from",
    )
    reward_versions: list[str] = Field(default_factory=list)
    calibration_versions: list[str] = Field(default_factory=list)
    policy_versions: list[str] = Field(default_factory=list)
    builder_config: JsonDict = Field(default_factory=dict)
    sha256: str = ""


class PolicyUpdated(EventBase):
    """A training step produced a new policy. `trajectory_id` carries the policy version (the key)."""

    type: Literal["policy.updated"] = "policy.updated"
    policy_version: str
    previous_version: str | None = None
    base_model: str = ""
    base_model_id: Id = Field(
        "",
        description="id of the base weights and config it was trained on (clients.base_model.base_model_id; "
        "'' = unknown); a policy server on another base refuses the version (since 1.4)",
    )
    tokenizer_hash: Id = Field(
        "",
        description="hash of the base's tokenizer and chat template (clients.base_model.tokenizer_hash; "
        "'' = unknown), as recorded on every sampled step (since 1.4)",
    )
    checkpoint_path: str = ""
    method: str = ""
    step: Count = 0
    batch_ids: list[str] = Field(default_factory=list)
    metrics: dict[str, float] = Field(
        default_factory=dict,
        description="the update's metrics: loss, is_ratio_mean, is_ratio_max, ess, clipped_fraction, "
        "is_truncated_fraction, kl, lr, grad_norm, tokens, dropped_groups, trained_groups",
    )
    # Lineage: what this version was trained on, down to the records (see `agentstream lineage`).
    source_ranges: dict[str, dict[str, list[int]]] = Field(
        default_factory=dict,
        description="topic -> partition -> [first, last] offset of the records its batches were built from",
    )
    trajectory_ids: list[str] = Field(default_factory=list, description="trajectories it trained on")
    behaviour_versions: list[str] = Field(
        default_factory=list, description="policy versions that sampled the data it trained on"
    )
    staleness_histogram: dict[str, int] = Field(
        default_factory=dict, description="versions behind -> GRPO groups admitted at that staleness"
    )
    dropped_groups: Count = Field(0, description="GRPO groups dropped whole as too stale")

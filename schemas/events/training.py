"""The training loop's events: `training.batches` (a batch's rows, then the batch was built) and
`policy.updates` (a training step produced a new policy version).

Since 1.5 a batch's rows travel in the log: the trainer publishes `batch.rows` chunks keyed by the
batch id (so, on one partition, before it), then `batch.built` naming how many chunks and the rows'
checksum; an executor on another machine assembles and verifies them (no shared disk).
`batch.built` with `chunks == 0` (every event before 1.5) points only to the file at `path`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from schemas.bounded import Count, Id, JsonDict, JsonObjectItem
from schemas.events.envelope import EventBase

BatchKind = Literal["sft", "sft_tokenized", "dpo", "dpo_step", "grpo"]
Sha256 = Annotated[str, Field(max_length=64)]  # hex; a wrong one is caught by the comparison it is for


class BatchBuilt(EventBase):
    """A training batch was built (its file written; since 1.5 its rows published before it as
    `chunks` batch.rows events). `trajectory_id` carries the batch id (the topic key)."""

    type: Literal["batch.built"] = "batch.built"
    batch_id: str
    kind: BatchKind
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
    chunks: Count = Field(
        0,
        description="how many batch.rows events before this one carry the rows; 0 = the rows are only "
        "in the file at `path` (every batch before 1.5) (since 1.5)",
    )
    rows_sha256: Sha256 = Field(
        "",
        description="sha256 of the rows' canonical JSONL (each row as compact JSON, orjson, plus a "
        "newline): equals `sha256` for a jsonl batch; what an executor checks the assembled chunks "
        "against ('' = not given) (since 1.5)",
    )


class BatchRows(EventBase):
    """One chunk of a batch's rows (since 1.5). `trajectory_id` carries the batch id (the topic key),
    so every chunk lands on the partition of its `batch.built`, before it. Its event id depends only
    on the batch, its checksum and `index`: a re-publish after a crash is a duplicate."""

    type: Literal["batch.rows"] = "batch.rows"
    batch_id: Id = Field(min_length=1)
    kind: BatchKind
    index: Count = Field(
        description="this chunk's place, 0 .. chunks - 1; the executor refuses one past (since 1.5)"
    )
    chunks: Count = Field(ge=1, description="how many chunks the batch has (since 1.5)")
    rows_sha256: Sha256 = Field(description="the batch's `rows_sha256`: which rows these are (since 1.5)")
    rows: list[JsonObjectItem] = Field(
        description="the chunk's rows, in batch order, as JSON objects (since 1.5)"
    )


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
    gate: Literal["", "accepted", "refused"] = Field(
        "",
        description="the evaluation gate's decision (`agentstream train --gate`): accepted or refused "
        "against the version serving when it was trained; '' = no gate ran. A refused version stays in "
        "the lineage but is never made current (clients.current_policy) (since 1.5)",
    )
    gate_figures: dict[str, float] = Field(
        default_factory=dict,
        description="the gate's evidence: held-out episodes, successes and rates of this version and of "
        "the serving one, discordant pairs, the one-sided exact McNemar p and alpha (since 1.5)",
    )

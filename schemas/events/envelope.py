"""The envelope every event carries (`EventBase`), the schema version, and `utc_now`.

The rules every event follows are in the package docstring (`schemas.events`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from schemas.bounded import Id

SCHEMA_MAJOR = 1
# 1.1: `redactions` on the events that carry free text (issue #18)
# 1.2: reward layers on `trajectory.scored`: per step `layers` / `missing_layers`, and the
#      trajectory's `reward_definition` (issue #17)
# 1.3: bounds on the fields that size work (`schemas.limits`); dead.letter's payload summary (#34)
# 1.4: the base a version was trained on, `base_model_id` / `tokenizer_hash`, on policy.updated, and
#      each step's `tokenizer_hash` on trajectory.scored (#36)
# 1.5: `purpose` ("train" | "eval") on episode.started and trajectory.scored: batch builders train on
#      "train" episodes only (#38)
#      `gate` / `gate_figures` on policy.updated: the evaluation gate's decision and evidence; a
#      refused version is never current (#38)
#      `rows_over_max_length` / `tokens_over_max_length` in policy.updated's metrics: rows over
#      --max-length are left out of the update and counted, never cut (#38)
#      `batch.rows` on training.batches, and `chunks` / `rows_sha256` on batch.built: a batch's rows
#      travel in the log, checked by the executor (no shared disk) (#38)
SCHEMA_VERSION = f"{SCHEMA_MAJOR}.5"

PURPOSE_HELP = (
    'why the episode was run: "train" (rollouts, any agent) or "eval" (`agentstream eval`); batch '
    'builders leave out every episode whose purpose is not "train" (since 1.5)'
)
Purpose = Literal["train", "eval"]

REDACTIONS_HELP = "secrets replaced by a [REDACTED:<detector>] placeholder before publishing (since 1.1)"


def utc_now() -> datetime:
    return datetime.now(UTC)


class EventBase(BaseModel):
    """The envelope every event carries."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False, populate_by_name=True)

    event_id: Id = Field(min_length=1, description="unique; derived events use a deterministic id")
    type: str
    schema_version: str = Field(SCHEMA_VERSION, pattern=r"^\d+\.\d+$", max_length=32)
    trajectory_id: Id = Field(min_length=1, description="partition key: one trajectory, one partition")
    occurred_at: AwareDatetime = Field(description="when it happened, timezone-aware (stored as UTC)")
    producer: Id = Field(min_length=1, description="who wrote the event, e.g. 'sdk/0.1.0' or 'rules'")

    @field_validator("occurred_at")
    @classmethod
    def _to_utc(cls, value: datetime) -> datetime:
        return value.astimezone(UTC)

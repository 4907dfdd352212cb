"""What a policy version is: the trainer state each checkpoint carries (`TrainState`: optimizer step,
version counter, batches trained or dropped), how the next version is numbered (v1, v2, ... by
the counter, never reused), and the `policy.updated` event that announces it.

Pure: no torch, no disk. Writing and reading checkpoints is `checkpoints`; publishing is `follow`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from consumers.errors import TrainerError
from schemas.events import PolicyUpdated, utc_now
from schemas.ids import derived_event_id
from schemas.policy_versions import version_number


@dataclass
class TrainState:
    step: int = 0
    policy_version: str | None = None
    batches: list[str] = field(default_factory=list)  # trained or dropped whole (replays skip them)
    last_event: dict[str, Any] | None = None
    versions: int = 0  # versions published so far: the next is v{versions + 1}
    pending_dropped: int = 0  # groups dropped since the last version, reported in the next one

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainState:
        """Read `state.json`; one written before the version counter derives it from its version."""
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        data.setdefault("versions", version_number(data.get("policy_version")) or 0)
        return cls(**data)

    def next_version(self, batch_id: str) -> str | None:
        """Number the version trained on `batch_id` (v{versions + 1}); returns the previous one.

        >>> state = TrainState(policy_version="v2", versions=2, pending_dropped=3)
        >>> state.next_version("b7"), state.policy_version, state.batches, state.pending_dropped
        ('v2', 'v3', ['b7'], 0)
        """
        previous = self.policy_version
        self.versions += 1
        self.policy_version = f"v{self.versions}"
        self.batches.append(batch_id)
        self.pending_dropped = 0
        return previous

    def drop_batch(self, batch_id: str, dropped_groups: int) -> None:
        """Record a batch that made no version; its groups are reported with the next version."""
        self.batches.append(batch_id)
        self.pending_dropped += dropped_groups


def policy_event(
    state: TrainState,
    base_model: str,
    ckpt_root: Path,
    previous: str | None,
    method: str,
    batch_ids: list[str],
    metrics: dict[str, float],
    **lineage: Any,
) -> PolicyUpdated:
    """The event of `state`'s current version (its checkpoint under `ckpt_root`); `lineage` fills
    PolicyUpdated's lineage fields."""
    version = state.policy_version
    return PolicyUpdated(
        event_id=derived_event_id("policy.updated", version, *batch_ids),
        trajectory_id=version,
        occurred_at=utc_now(),
        producer="trainer-executor",
        policy_version=version,
        previous_version=previous,
        base_model=base_model,
        checkpoint_path=str(ckpt_root / version),
        method=method,
        step=state.step,
        batch_ids=batch_ids,
        metrics=metrics,
        **lineage,
    )


def check_same_base(state: TrainState, base_id: str, tokenizer: str, checkpoint: Path) -> None:
    """Refuse to resume `checkpoint` when its last version names another base than the one
    configured (`base_model_id` / `tokenizer_hash`; '' on either side is unknown, not checked).

    >>> s = TrainState(policy_version="v2", last_event={"base_model_id": "aa", "tokenizer_hash": "t"})
    >>> check_same_base(s, "aa", "t", Path("/c/v2"))
    >>> check_same_base(s, "bb", "t", Path("/c/v2"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    consumers.errors.TrainerError: --base-model: checkpoint /c/v2 (v2) was trained on base_model_id 'aa', ...
    """
    event = state.last_event or {}
    for name, configured in (("base_model_id", base_id), ("tokenizer_hash", tokenizer)):
        recorded = event.get(name) or ""
        if recorded and configured and recorded != configured:
            raise TrainerError(
                f"--base-model: checkpoint {checkpoint} ({state.policy_version}) was trained on {name} "
                f"{recorded!r}, the configured base is {configured!r}; point --base-model "
                "(AGENTSTREAM_BASE_MODEL) at its base, or start from another --data-dir"
            )

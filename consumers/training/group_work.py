"""Rank 0 hands each unit of training work to the other ranks of a training group.

In a group (WORLD_SIZE > 1) only rank 0 reads Kafka, checks replays, checkpoints and publishes, but
every rank must enter `executor.train_batch` with the same rows at the same time (its collectives:
gradient all-reduce, summed metrics). So:

- `LeadExecutor` wraps rank 0's executor: `train_batch` first broadcasts the work item (rows,
  method, batch id, source ranges, and the version rank 0 trains from), then trains; `.state` and
  everything else are the executor's. The follow loop's handler takes it as its `executor`.
- `follow_lead` is the loop of every other rank: receive an item, train on it, until a stop item
  (rank 0 sends one when it stops following: SIGTERM or idle exit). A rank whose checkpoint state
  is not at the version rank 0 trains from (a checkpoint dir the ranks do not share) refuses to go on.

Only a `TrainerError` (a refusal decided on the whole batch before any collective, so the same on
every rank) is dead-lettered by rank 0 and skipped by the others. Anything else raised while a
group trains (a rank died mid-collective: gloo's "Connection closed by peer", or an error only one
rank's share of rows hit) is `GroupBroken`: not the record's fault, so it is not dead-lettered and
its offset is not committed; the rank exits, the launcher (`agentstream train --nproc`, torchrun)
stops and restarts the whole group, and it resumes from the latest checkpoint and trains the record
again. Nothing here times out on purpose: the collectives' long timeout is
`distributed.DEFAULT_TIMEOUT_S`.
"""

from __future__ import annotations

import logging
from typing import Any

from consumers.errors import TrainerError
from consumers.training.distributed import Ranks, broadcast_object

log = logging.getLogger(__name__)

TRAIN, STOP = "train", "stop"


class GroupBroken(TrainerError):
    """Training in a group failed for a reason other than the batch (a rank gone, a collective
    broken): retryable, so the follow loop raises it instead of dead-lettering the record."""

    retryable = True  # clients.kafka.poison.is_poison: an outage, not a poison


class LeadExecutor:
    """Rank 0's executor in a group: each `train_batch` is broadcast to the other ranks first."""

    def __init__(self, executor, ranks: Ranks):
        self.executor, self.ranks = executor, ranks

    @property
    def state(self):
        return self.executor.state

    def train_batch(
        self, rows: list[dict[str, Any]], method: str, batch_id: str, *, source_ranges: dict | None = None
    ):
        item = {
            "kind": TRAIN,
            "rows": rows,
            "method": method,
            "batch_id": batch_id,
            "source_ranges": source_ranges,
            "from_version": self.executor.state.policy_version,
        }
        try:
            broadcast_object(self.ranks, item)
            return self.executor.train_batch(rows, method, batch_id, source_ranges=source_ranges)
        except TrainerError:
            raise  # refused on the whole batch before any collective: the same on every rank
        except Exception as exc:
            raise GroupBroken(
                f"rank 0: training {batch_id} in a group of {self.ranks.world_size} failed ({exc!r}); "
                "not the batch's fault: exiting so that the group restarts and trains it again"
            ) from exc

    def stop_others(self) -> None:
        """Tell the other ranks to stop (they return from `follow_lead`)."""
        broadcast_object(self.ranks, {"kind": STOP})

    def __getattr__(self, name: str):
        return getattr(self.executor, name)  # the model, the config... as the bare executor has them


def follow_lead(executor, ranks: Ranks) -> int:
    """Ranks > 0: train on every item rank 0 broadcasts until a stop item; returns 0 then."""
    while True:
        item = broadcast_object(ranks, None)
        kind = item.get("kind") if isinstance(item, dict) else None
        if kind == STOP:
            log.info("executor: rank %d stopping (rank 0 stopped following)", ranks.rank)
            return 0
        if kind != TRAIN:
            raise TrainerError(f"rank {ranks.rank}: work item kind {kind!r} from rank 0 is not train or stop")
        check_version(executor.state.policy_version, item["from_version"], ranks)
        try:
            executor.train_batch(
                item["rows"], item["method"], item["batch_id"], source_ranges=item["source_ranges"]
            )
        except TrainerError as exc:  # rank 0 refuses (dead-letters) the same batch
            log.warning("executor: rank %d: %s refused: %s", ranks.rank, item["batch_id"], exc)


def check_version(mine: str | None, lead: str | None, ranks: Ranks) -> None:
    """A rank trains from the version rank 0 trains from, or not at all.

    >>> check_version("v2", "v2", Ranks(1, 2, 1))
    >>> try:
    ...     check_version("v1", "v2", Ranks(1, 2, 1))
    ... except TrainerError as exc:
    ...     str(exc).split(";")[0]
    "rank 1: resumed at version 'v1' but rank 0 trains from 'v2'"
    """
    if mine != lead:
        raise TrainerError(
            f"rank {ranks.rank}: resumed at version {mine!r} but rank 0 trains from {lead!r}; every rank "
            "must read the same checkpoint dir (--data-dir on one machine, or a shared one)"
        )

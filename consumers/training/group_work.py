"""Rank 0 hands each unit of training work to the other ranks of a training group.

In a group (WORLD_SIZE > 1) only rank 0 reads Kafka, checks replays, checkpoints and publishes, but
every rank must enter `executor.train_batch` with the same rows at the same time (its collectives:
gradient all-reduce, summed metrics). So:

- `LeadExecutor` wraps rank 0's executor: `train_batch` first broadcasts the work item (rows,
  method, batch id, source ranges, and the version rank 0 trains from), then trains; `.state` and
  everything else are the executor's. The follow loop's handler takes it as its `executor`.
- `LeadExecutor.restore` (the evaluation gate refused the version just trained) broadcasts a
  restore item first, so every rank goes back to the serving version's weights together (a rank
  that did not would train diverged weights).
- `follow_lead` is the loop of every other rank: receive an item, train on it (or restore), until a
  stop item (rank 0 sends one when it stops following: SIGTERM or idle exit). A rank whose checkpoint state
  is not at the version rank 0 trains from (a checkpoint dir the ranks do not share) refuses to go on.

Only a `TrainerError` (a refusal decided on the whole batch before any collective, so the same on
every rank) is dead-lettered by rank 0 and skipped by the others. Anything else raised while a
group trains (a rank died mid-collective: gloo's "Connection closed by peer", or an error only one
rank's share of rows hit) is `GroupBroken`: not the record's fault, so it is not dead-lettered and
its offset is not committed; the rank exits, the launcher (`agentstream train --nproc`, torchrun)
stops and restarts the whole group, and it resumes from the latest checkpoint and trains the record
again. Nothing here times out on purpose: the collectives' long timeout is
`distributed.DEFAULT_TIMEOUT_S`. That timeout also bounds the other ranks' wait for their next item,
so while rank 0 has none to send (no batch for a while, the evaluation gate playing its episodes, a
slow publish) its keepalive thread (`LeadExecutor.start_keepalive`) sends an idle item every
`distributed.keepalive_interval_s` (60 s), which they skip; one lock orders it with the train,
restore and stop items. Not inside `train_batch`: a checkpoint save on rank 0 longer than the timeout
still breaks the group (the launcher restarts it).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from consumers.errors import TrainerError
from consumers.training.distributed import (
    Ranks,
    bind_thread,
    broadcast_object,
    group_timeout_s,
    keepalive_interval_s,
)

log = logging.getLogger(__name__)

TRAIN, RESTORE, STOP = "train", "restore", "stop"
IDLE = "idle"  # nothing to do: sent so the other ranks' wait stays under the collective timeout


class GroupBroken(TrainerError):
    """Training in a group failed for a reason other than the batch (a rank gone, a collective
    broken): retryable, so the follow loop raises it instead of dead-lettering the record."""

    retryable = True  # clients.kafka.poison.is_poison: an outage, not a poison


class LeadExecutor:
    """Rank 0's executor in a group: each `train_batch` is broadcast to the other ranks first."""

    def __init__(self, executor, ranks: Ranks):
        self.executor, self.ranks = executor, ranks
        self._lock = threading.Lock()  # one item at a time, and none while a batch trains
        self._sent = time.monotonic()  # when the last item went out
        self._closed = threading.Event()
        self._keepalive: threading.Thread | None = None
        self._failure: BaseException | None = None  # the keepalive's broadcast failed
        self.idle_sent = 0

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
            with self._lock:  # no idle item between this item and the training's own collectives
                self._send(item)
                return self.executor.train_batch(rows, method, batch_id, source_ranges=source_ranges)
        except TrainerError:
            raise  # refused on the whole batch before any collective: the same on every rank
        except Exception as exc:
            raise GroupBroken(
                f"rank 0: training {batch_id} in a group of {self.ranks.world_size} failed ({exc!r}); "
                "not the batch's fault: exiting so that the group restarts and trains it again"
            ) from exc

    def restore(self, version: str) -> None:
        """Every rank goes back to `version`'s weights (`TrainingExecutor.restore`)."""
        try:
            with self._lock:
                self._send({"kind": RESTORE, "version": version})
                self.executor.restore(version)
        except Exception as exc:
            raise GroupBroken(
                f"rank 0: going back to {version} in a group of {self.ranks.world_size} failed ({exc!r}); "
                "exiting so that the group restarts (it resumes from that version)"
            ) from exc

    def stop_others(self) -> None:
        """Tell the other ranks to stop (they return from `follow_lead`)."""
        with self._lock:
            self._closed.set()
            self._send({"kind": STOP})

    def start_keepalive(self, interval_s: float | None = None) -> LeadExecutor:
        """Send an idle item whenever no item went out for `interval_s` (default: from the group's
        timeout, `keepalive_interval_s(group_timeout_s())`), on a daemon thread, until `close`."""
        interval = keepalive_interval_s(group_timeout_s()) if interval_s is None else interval_s
        if interval <= 0:
            raise TrainerError(f"keepalive interval_s: must be > 0, got {interval!r}")
        self._keepalive = threading.Thread(
            target=self._keep_alive, args=(interval,), name="group-keepalive", daemon=True
        )
        self._keepalive.start()
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the keepalive (before leaving the group); safe to call more than once."""
        self._closed.set()
        if self._keepalive is not None:
            self._keepalive.join(timeout_s)

    def _send(self, item: dict[str, Any]) -> None:  # the caller holds the lock
        if self._failure is not None:
            raise self._failure
        broadcast_object(self.ranks, item)
        self._sent = time.monotonic()

    def _keep_alive(self, interval_s: float) -> None:
        bind_thread(self.ranks)
        while not self._closed.wait(min(1.0, interval_s / 4)):
            with self._lock:
                if self._closed.is_set() or time.monotonic() - self._sent < interval_s:
                    continue
                try:
                    self._send({"kind": IDLE})
                except Exception as exc:  # a rank gone: the launcher restarts the group
                    log.error("executor: rank 0 could not send an idle item (%r); keepalive stops", exc)
                    self._failure = exc
                    return
                self.idle_sent += 1

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
        if kind == IDLE:
            continue
        if kind == RESTORE:
            log.info("executor: rank %d going back to %s (refused by the gate)", ranks.rank, item["version"])
            executor.restore(item["version"])
            continue
        if kind != TRAIN:
            raise TrainerError(
                f"rank {ranks.rank}: work item kind {kind!r} from rank 0 is not train, restore, idle or stop"
            )
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

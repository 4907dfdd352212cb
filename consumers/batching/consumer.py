"""`agentstream batch`: the kafka-python shell around the planner (I/O only).

Loop: poll `trajectory.scored` -> planner lanes -> for each due batch: write it atomically with its
manifest, publish its rows as `batch.rows` chunks and then `batch.built` (acks=all, every chunk
acknowledged before the event is sent), mark it published -> commit, per partition, the lowest
offset still pending in any lane. Bad input goes to the DLQ before its offset is committed.

A row too large for any `batch.rows` event (`row_chunks.MAX_ROW_BYTES` of JSON) cannot travel, and
the same batch would be rebuilt after every restart: before the batch is written, the trajectory
that made such a row (its whole group, for a grouped kind) is left out of it and dead-lettered with
its source coordinates and a reason naming the batch, the row and both sizes; the rest of the batch
is published (`leave_out_oversize`; counted in `builder_config` as `left_out_by_row_size`).

On start: `BatchStore.recover()` (drop unfinished files, learn what is batched), re-publish
manifests whose event may be missing (same deterministic event id), then resume from the committed
offsets; replay rebuilds pending groups and skips trajectories already in a manifest. The chunks of
a re-published batch are read back from its file (the trainer's own record) and carry the same event
ids as before, so an executor drops them as duplicates. Partitions are
assigned manually (no group rebalancing): the batch builder is one process, because a GRPO group spans
partitions. `policy.updates` is always read from the beginning, every event folded into the current
policy by `schemas.policy_versions` (version order, not arrival order; the same answer as
`clients.current_policy`), for its version and training step (staleness and horizon schedules).
"""

from __future__ import annotations

import io
import logging
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

from clients.kafka import ensure_topics, make_consumer, make_producer
from clients.kafka.consume import ConsumeLoop, LoopConfig, Refused, assign_from_committed
from clients.kafka.dead_letters import letter_for, publish_dead_letters
from consumers.batching.base_tokenizer import BaseTokenizerHash
from consumers.batching.batch_writer import BatchManifest, BatchStore, Recovered, batch_id_for, encode_rows
from consumers.batching.config import BatchBuilderConfig
from consumers.batching.planner import Entry, PlannedBatch, Planner
from consumers.batching.row_chunks import MAX_ROW_BYTES, oversize_rows, row_trajectory_ids
from consumers.errors import TrainerError
from schemas import topics
from schemas.codec import decode, encode
from schemas.errors import DecodeError
from schemas.events import BatchBuilt, DeadLetter, PolicyUpdated, TrajectoryScored
from schemas.ids import derived_event_id
from schemas.records import Record

log = logging.getLogger(__name__)

STAGE = "trainer"  # client id and DLQ stage: the old name, kept so dead letters stay comparable


def run_batch_builder(config: BatchBuilderConfig) -> int:
    """`agentstream batch`: load the tokenizer the kinds need, then consume until SIGTERM."""
    tokenizer = load_tokenizer(config.tokenizer, config.data_dir)
    return BatchBuilder(config, tokenizer).run()


def load_tokenizer(spec: str | None, data_dir: Path):
    """A tokenizer from a local directory, or the tiny one built under `data_dir` (`'tiny'`)."""
    if not spec:
        return None
    from transformers import AutoTokenizer

    from consumers.tiny_model import tiny_model_dir

    path = tiny_model_dir(data_dir) if spec == "tiny" else Path(spec)
    if not path.exists():
        raise TrainerError(f"--tokenizer: {spec!r} is not a local directory (or 'tiny')")
    return AutoTokenizer.from_pretrained(path)


def known_state(recovered: Recovered) -> tuple[dict[str, set[str]], dict[str, dict[str, str]]]:
    """Per kind: batched trajectory ids, and content hash -> trajectory id (for dedup)."""
    hashes: dict[str, dict[str, str]] = {}
    for m in recovered.manifests:
        hashes.setdefault(m.kind, {}).update(zip(m.content_hashes, m.trajectory_ids, strict=False))
    return recovered.trajectory_ids, hashes


def travelling_rows(rows: list[dict[str, Any]], fmt: str) -> list[dict[str, Any]]:
    """The rows as their `batch.rows` chunks will carry them: a Parquet file gives every row every
    key back (absent ones as None), which makes a row larger."""
    if fmt != "parquet":
        return rows
    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(encode_rows(rows, fmt))).to_pylist()


def leave_out_oversize(
    batch: PlannedBatch, fmt: str = "jsonl", max_row_bytes: int = MAX_ROW_BYTES
) -> tuple[PlannedBatch | None, list[DeadLetter]]:
    """`batch` without the trajectories whose rows no `batch.rows` event can carry (with their whole
    group, for a grouped kind: a group's rows compare its members), and a dead letter for each one
    left out (source coordinates, a reason naming the batch, the row and both sizes). None when
    nothing is left. A batch with no such row comes back as it is, with no letters."""
    over = oversize_rows(travelling_rows(batch.rows, fmt), max_row_bytes)
    if not over:
        return batch, []
    units = [[m.item for m in g.members] for g in batch.groups] or [[e] for e in batch.entries]
    unit_of = {e.trajectory.trajectory_id: i for i, unit in enumerate(units) for e in unit}
    planned = batch_id_for(batch.kind, [e.trajectory.trajectory_id for e in batch.entries])
    causes: dict[int, str] = {}  # unit index -> the first oversize row that sinks it
    for index, size in over.items():
        named = sorted(row_trajectory_ids(batch.rows[index]) & unit_of.keys())
        if not named:
            raise TrainerError(
                f"batch {planned}: row {index} takes {size} bytes as JSON, over the {max_row_bytes} one "
                "batch.rows event can carry, and names no trajectory of the batch to leave out"
            )
        for tid in named:
            causes.setdefault(
                unit_of[tid],
                f"row {index} (trajectory {tid}) takes {size} bytes as JSON, over the {max_row_bytes} "
                "one batch.rows event can carry",
            )
    dropped = {e.trajectory.trajectory_id for i in causes for e in units[i]}
    entries = [e for e in batch.entries if e.trajectory.trajectory_id not in dropped]
    rest = batch_id_for(batch.kind, [e.trajectory.trajectory_id for e in entries]) if entries else None
    letters = [
        _oversize_letter(batch, planned, rest, cause, entry, len(units[i]))
        for i, cause in sorted(causes.items())
        for entry in units[i]
    ]
    if not entries:
        return None, letters
    return _without(batch, entries, set(causes), dropped), letters


def _without(batch: PlannedBatch, entries: list[Entry], units: set[int], dropped: set[str]) -> PlannedBatch:
    """`batch` with only `entries`: the rows of `dropped` trajectories and the groups `units` gone,
    and the count in its builder config (and its extra, with the group counts, for a grouped kind)."""
    groups = [g for i, g in enumerate(batch.groups) if i not in units]
    count = {"left_out_by_row_size": len(dropped)}
    extra = batch.extra
    if batch.groups:
        incomplete = sum(not g.complete for g in groups)
        extra = extra | count | {"groups": len(groups), "incomplete_groups": incomplete}
    return replace(
        batch,
        rows=[r for r in batch.rows if not row_trajectory_ids(r) & dropped],
        entries=entries,
        groups=groups,
        builder_config=batch.builder_config | count,
        extra=extra,
    )


def _oversize_letter(
    batch: PlannedBatch, planned: str, rest: str | None, cause: str, entry: Entry, unit_size: int
) -> DeadLetter:
    t = entry.trajectory
    left_out = f"left out with its group of {unit_size}" if batch.groups else "left out"
    published = f"the rest published as batch {rest}" if rest else "nothing else in the batch"
    reason = f"batch {planned} ({batch.kind}): {cause}; trajectory {t.trajectory_id} {left_out}, {published}"
    source = Record(
        entry.source.topic, entry.source.partition, entry.source.offset, t.trajectory_id.encode(), encode(t)
    )
    letter = letter_for(STAGE, source, reason, "RowTooLarge")
    # one source record can be left out by several kinds: one letter each, not one id for all
    return letter.model_copy(
        update={"event_id": derived_event_id("dead.letter", letter.event_id, batch.kind)}
    )


class BatchBuilder:
    """The batch builder process: the `clients.kafka.consume` loop's handler around the planner."""

    def __init__(self, options: BatchBuilderConfig, tokenizer: Any = None):
        self.options, self.config = options, options.planner
        self.store = BatchStore(options.data_dir)
        recovered = self.store.recover()
        ids, hashes = known_state(recovered)
        base = BaseTokenizerHash(options.base_model, options.data_dir)  # GRPO's check: loaded when needed
        self.planner = Planner(options.planner, ids, hashes, tokenizer, base)
        self._unpublished = recovered.unpublished
        self._stop = False

    def _clients(self):
        self.producer = make_producer(self.options.bootstrap_servers, STAGE)
        # A fetch waits for a few trajectories rather than answering each one: a Kafka client pays
        # far more per fetch than per record (docs/benchmarks.md, "e2e: where the CPU goes").
        self.consumer = make_consumer(
            self.options.bootstrap_servers,
            STAGE,
            self.options.group_id,
            fetch_min_bytes=self.options.fetch_min_bytes,
            fetch_max_wait_ms=self.options.fetch_max_wait_ms,
        )

    def publish(self, event, topic: str) -> None:
        key = event.trajectory_id.encode()
        self.producer.send(topic, key=key, value=encode(event)).get(timeout=30)

    def publish_batch(self, manifest: BatchManifest) -> BatchBuilt:
        """The batch's `batch.rows` chunks, every one acknowledged, then its `batch.built`; all keyed by
        the batch id, so on one partition and in this order. The rows come from the batch's file."""
        *chunks, event = manifest.events()
        sent = [
            self.producer.send(topics.TRAINING_BATCHES, key=c.trajectory_id.encode(), value=encode(c))
            for c in chunks
        ]
        for future in sent:
            future.get(timeout=30)
        self.publish(event, topics.TRAINING_BATCHES)
        self.store.mark_published(manifest)
        return event

    def republish(self) -> None:
        for manifest in self._unpublished:
            log.info("recovery: re-publishing batch.built for %s", manifest.batch_id)
            self.publish_batch(manifest)
        self._unpublished = []

    def run(self) -> int:
        from kafka.errors import KafkaError

        signal.signal(signal.SIGTERM, self._on_term)
        ensure_topics(self.options.bootstrap_servers)
        self._clients()
        try:
            self.republish()
            watched = [topics.TRAJECTORY_SCORED, topics.POLICY_UPDATES]
            loop = ConsumeLoop(self.consumer, self.producer, self, self._loop_config())
            loop.committed.update(
                assign_from_committed(self.consumer, watched, rewind=(topics.POLICY_UPDATES,))
            )
            loop.run(lambda: self._stop)
        except KafkaError as exc:
            log.error("trainer: kafka error, exiting so a supervisor restarts us: %s", exc)
            return 1
        finally:
            self._close()
        return 0

    def _loop_config(self) -> LoopConfig:
        o = self.options
        return LoopConfig(STAGE, "cannot be planned", o.poll_timeout_ms, o.max_records, o.idle_exit_s)

    def _on_term(self, *_: object) -> None:
        self._stop = True

    # --- the loop's handler ---------------------------------------------------------------------

    def handle(self, record: Record, now: float) -> None:
        """Decode one record: a policy update moves the planner's version, a scored trajectory is
        offered to the planner; anything else is refused (a dead letter)."""
        try:
            event = decode(record.value)
        except DecodeError:
            raise
        except Exception as exc:  # a parser's own limit (e.g. RecursionError): the record's fault
            raise Refused(f"not decodable: {exc!r}", type(exc).__name__) from None
        if record.topic == topics.POLICY_UPDATES:
            if isinstance(event, PolicyUpdated):
                self.planner.policy_updated(event)
            return
        if not isinstance(event, TrajectoryScored):
            raise Refused(
                f"type: expected trajectory.scored on {record.topic}, got {event.type!r}", "WrongEventType"
            )
        self.planner.offer(event, Record(record.topic, record.partition, record.offset), now)

    def write(self, now: float, force: bool) -> bool:
        return bool(self.flush(now, force))

    def commit_positions(self, consumed: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """The lowest offset still pending in any lane; `policy.updates` is re-read from the start
        each run and never committed."""
        return self.planner.commit_positions(
            {tp: o for tp, o in consumed.items() if tp[0] != topics.POLICY_UPDATES}
        )

    def flush(self, now: float, force: bool = False) -> list[BatchBuilt]:
        """Write, publish and mark every due batch; returns the events published."""
        published = []
        while batches := self.planner.due(now, force):
            for batch in batches:
                event = self._commit_batch(batch)
                if event is not None:
                    published.append(event)
        return published

    def _commit_batch(self, planned: PlannedBatch) -> BatchBuilt | None:
        """Leave out (and dead-letter) what cannot travel, then write and publish the rest. The letters
        are acknowledged here, before any offset that covers their records is committed."""
        batch, letters = leave_out_oversize(planned, self.options.format)
        publish_dead_letters(self.producer, letters)
        if batch is None:
            return None
        manifest = self.store.write(batch.kind, batch.rows, batch.meta(), fmt=self.options.format)
        event = self.publish_batch(manifest)
        self.planner.committed(batch)
        return event

    def _close(self) -> None:
        for client in (getattr(self, "consumer", None), getattr(self, "producer", None)):
            if client is not None:
                try:
                    client.close()
                except Exception:  # closing after a broker failure must not hide the original error
                    log.debug("trainer: error while closing a client", exc_info=True)

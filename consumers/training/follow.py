"""The executor's I/O shell: train on one batch file, or follow `training.batches`.

Follow mode is effectively-once per batch and publishes each version exactly once:

- the checkpoint's `state.json` lists the batches already trained (skipped on replay), so a batch
  trains at most once per version;
- on start, `policy.updates` is read to its end; the latest checkpoint's `policy.updated` is
  published only when it is not there (the process died between checkpoint and publish), so no
  version is skipped and none is published twice;
- the offset of a batch is committed only after its event is acknowledged (or after the executor
  made no version of it: every group dropped as stale, or it was dead-lettered with its coordinates).

The loop is `clients.kafka.consume.ConsumeLoop`, one record per cycle; this module is its handler.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import orjson

from clients.kafka import ensure_topics, make_consumer, make_producer, read_to_end
from clients.kafka.consume import ConsumeLoop, LoopConfig, assign_from_committed
from clients.kafka.ranges import ReadIncomplete
from consumers.batching.batch_writer import load_manifest, read_rows
from consumers.batching.kinds import KINDS
from consumers.errors import TrainerError
from consumers.training import checkpoints
from consumers.training.batch_rows import BatchRowsAssembler, LogReader
from consumers.training.config import TrainRunConfig
from consumers.training.distributed import Ranks, broadcast_object, join_group, leave_group
from consumers.training.executor import TrainingExecutor
from consumers.training.gate import Gate
from consumers.training.group_work import LeadExecutor, follow_lead
from schemas import topics
from schemas.codec import decode, encode
from schemas.events import BatchBuilt, BatchRows, PolicyUpdated
from schemas.records import Record

log = logging.getLogger(__name__)

CLIENT_ID = "trainer-executor"
STAGE = "executor"


def resolve_batch(path: Path, method: str | None) -> tuple[Path, str, str]:
    """(data file, batch id, method) for a batch file or a manifest."""
    manifest_path = (
        path
        if path.name.endswith(".manifest.json")
        else path.with_name(path.name.rsplit(".", 1)[0] + ".manifest.json")
    )
    if manifest_path.exists():
        manifest = load_manifest(manifest_path)
        return Path(manifest.path), manifest.batch_id, method or KINDS[manifest.kind].method
    if not path.exists():
        raise TrainerError(f"--batch: {str(path)!r} does not exist")
    if method is None:
        raise TrainerError(f"--batch: {path.name!r} has no manifest beside it; give --method sft|dpo|grpo")
    return path, path.name.rsplit(".", 1)[0], method


def publish_update(producer, event: PolicyUpdated) -> None:
    producer.send(topics.POLICY_UPDATES, key=event.trajectory_id.encode(), value=encode(event)).get(
        timeout=30
    )


def train_file(run: TrainRunConfig, gate: Gate | None = None) -> PolicyUpdated | None:
    """Train once on `run.batch`; returns the `policy.updated` event (published unless
    `run.publish` is false), or None when every GRPO group was too stale (no version made).
    In a group every rank trains on the rows rank 0 read (no shared disk needed); rank 0 publishes."""
    ranks = join_group(run.train.device)
    try:
        rows, method, batch_id = _batch_for_every_rank(run, ranks)
        executor = TrainingExecutor(run.train, run.data_dir, ranks)
        event = executor.train_batch(rows, method, batch_id)
        if event is not None and gate is not None and ranks.is_main:
            event = gate.check(event, executor.state)  # decided and saved before it is published
            checkpoints.roll_back_refused(executor.ckpt_root)  # refused: `latest` on the serving one
        if event is not None and run.publish and ranks.is_main:
            _publish_trained(run, event)
    finally:
        if ranks.distributed:
            leave_group()
    return event


def _batch_for_every_rank(run: TrainRunConfig, ranks: Ranks) -> tuple[list[dict], str, str]:
    """(rows, method, batch id) of `run.batch`, read by rank 0 and broadcast to the others; a
    failure to read it is raised on every rank (none waits for rows that never come)."""
    if not ranks.is_main:
        item = broadcast_object(ranks, None)
        if "error" in item:
            raise TrainerError(f"rank {ranks.rank}: rank 0 could not read --batch: {item['error']}")
        return item["rows"], item["method"], item["batch_id"]
    try:
        data, batch_id, method = resolve_batch(Path(run.batch or ""), run.method)
        rows = read_rows(data)
    except Exception as exc:
        broadcast_object(ranks, {"error": str(exc)})
        raise
    broadcast_object(ranks, {"rows": rows, "method": method, "batch_id": batch_id})
    return rows, method, batch_id


def _publish_trained(run: TrainRunConfig, event: PolicyUpdated) -> None:
    from kafka.errors import KafkaError

    try:
        producer = make_producer(run.bootstrap_servers, CLIENT_ID)
        publish_update(producer, event)
        producer.close()
    except KafkaError as exc:
        raise TrainerError(
            f"--bootstrap-servers: could not publish policy.updated to {run.bootstrap_servers!r} "
            f"({exc}); the checkpoint {event.checkpoint_path} is saved"
        ) from None


def follow(run: TrainRunConfig, gate: Gate | None = None) -> int:
    """Train on every `batch.built` of `run.follow_kinds()` until SIGTERM (or `run.idle_exit_s`).

    In a group only rank 0 consumes, checkpoints and publishes: its executor hands each batch to the
    other ranks (`group_work.LeadExecutor`), which train on what it sends until it stops following
    (`group_work.follow_lead`; their SIGTERM only waits for rank 0's stop)."""
    stop = {"now": False}
    # the caller's SIGTERM handler comes back when following ends (a test runner's, for one)
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    ranks, lead = Ranks(), None
    try:
        ranks = join_group(run.train.device)
        if not ranks.is_main:
            return follow_lead(TrainingExecutor(run.train, run.data_dir, ranks), ranks)
        ensure_topics(run.bootstrap_servers)
        executor = TrainingExecutor(run.train, run.data_dir, ranks)
        # the keepalive: the other ranks' wait for the next batch stays under the collective timeout
        lead = LeadExecutor(executor, ranks).start_keepalive() if ranks.distributed else executor
        producer = make_producer(run.bootstrap_servers, CLIENT_ID)
        settle = (lambda event: gate.settle(event, lead)) if gate is not None else None
        publish_unpublished(run.bootstrap_servers, producer, executor.state.last_event, settle)
        consumer = make_consumer(run.bootstrap_servers, CLIENT_ID, run.group_id)
        try:
            assembler = BatchRowsAssembler(
                max_bytes=run.max_assembly_mb << 20, reread=LogReader(run.bootstrap_servers)
            )
            trainer = BatchTrainer(lead, producer, run.follow_kinds(), gate, assembler)
            loop = ConsumeLoop(consumer, producer, trainer, _loop_config(run))
            loop.committed.update(assign_from_committed(consumer, [topics.TRAINING_BATCHES]))
            loop.run(lambda: stop["now"])
            if ranks.distributed:
                lead.stop_others()  # only after a clean stop: after a failure the launcher stops them
        finally:
            consumer.close()
            producer.close()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if ranks.distributed:
            if isinstance(lead, LeadExecutor):
                lead.close()
            leave_group()
    return 0


def _loop_config(run: TrainRunConfig) -> LoopConfig:
    # one batch per cycle: its offset is committed right after its version is announced
    return LoopConfig(STAGE, "cannot train on this record", 500, 1, run.idle_exit_s)


def publish_unpublished(bootstrap_servers: str, producer, last_event: dict | None, settle=None) -> bool:
    """Publish the latest checkpoint's `policy.updated` unless `policy.updates` already has it (by
    event id, or by policy version: a version is announced once). True when it published.
    `settle(event) -> event`: the evaluation gate (`gate.Gate.settle`), so a version checkpointed
    but not yet gated when the process died is gated (and, refused, rolled back) before it is first
    published."""
    if not last_event:
        return False
    event = PolicyUpdated.model_validate(last_event)
    for record in _policy_updates(bootstrap_servers):
        if record.get("event_id") == event.event_id or record.get("policy_version") == event.policy_version:
            log.info("executor: %s already published, not publishing it again", event.policy_version)
            return False
    log.info("executor: publishing %s (checkpointed, not yet published)", event.policy_version)
    if settle is not None:
        event = settle(event)
    publish_update(producer, event)
    return True


def _policy_updates(bootstrap_servers: str, timeout_s: float = 60.0) -> list[dict]:
    """Every record of `policy.updates` up to its end now; raises rather than return a partial read
    (a partial read could publish a version twice)."""
    try:
        records = read_to_end(bootstrap_servers, [topics.POLICY_UPDATES], timeout_s, strict=True)
    except ReadIncomplete as exc:
        raise TrainerError(f"executor: {exc}") from None
    return [orjson.loads(r.value) for r in records]


class BatchTrainer:
    """The loop's handler: train on each `batch.built` of `kinds` and announce the version. Since 1.5
    its rows come from the `batch.rows` chunks before it (`batch_rows.BatchRowsAssembler`: assembled
    and checked against `rows_sha256`; no file is read), or, for `chunks == 0`, from the file at
    `path`. While a batch is being assembled, the commit of its partition is held at its first
    chunk, so a kill -9 mid-assembly reads every chunk again; past the assembler's memory bound a
    batch is set aside, and its chunks are read again from the log when its `batch.built` comes
    (not readable now: `ChunksUnavailable`, retryable). A record that can never train
    (undecodable, chunks missing or tampered with, its batch file missing or unreadable, rows the
    executor refuses) raises and is dead-lettered by the loop with its coordinates, so its offset is
    committed and the follower goes on; the broker, the disk and the device failing raise past the
    loop (the process exits; the record is read again)."""

    def __init__(
        self,
        executor: TrainingExecutor,
        producer,
        kinds: tuple[str, ...],
        gate: Gate | None = None,
        assembler: BatchRowsAssembler | None = None,
    ):
        self.executor, self.producer, self.kinds, self.gate = executor, producer, kinds, gate
        self.assembler = assembler if assembler is not None else BatchRowsAssembler()

    def handle(self, record: Record, now: float) -> None:
        _train_event(self.executor, self.producer, record, self.kinds, self.gate, self.assembler)

    def write(self, now: float, force: bool) -> bool:
        return False  # a version is checkpointed and announced inside `handle`

    def commit_positions(self, consumed: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        held = self.assembler.holds()
        return {tp: min(offset, held.get(tp, offset)) for tp, offset in consumed.items()}


def _train_event(
    executor: TrainingExecutor,
    producer,
    record,
    kinds: tuple[str, ...],
    gate: Gate | None = None,
    assembler: BatchRowsAssembler | None = None,
) -> None:
    assembler = assembler if assembler is not None else BatchRowsAssembler()
    event = decode(record.value)
    if isinstance(event, BatchRows):
        if event.kind in kinds and event.batch_id not in executor.state.batches:
            assembler.add(event, record)
        return
    if not isinstance(event, BatchBuilt) or event.kind not in kinds:
        return
    if event.batch_id in executor.state.batches:
        assembler.discard(event.batch_id)
        log.info("executor: %s already trained (replay), skipping", event.batch_id)
        return
    rows = _batch_rows(event, record, assembler)
    if not rows:
        log.info("executor: %s has no rows, skipping", event.batch_id)
        return
    update = executor.train_batch(
        rows, KINDS[event.kind].method, event.batch_id, source_ranges=event.source_ranges
    )
    if update is None:  # every group too stale: no version was made, nothing to announce
        log.info("executor: %s made no version (every group dropped as stale)", event.batch_id)
        return
    if gate is not None:  # the evaluation gate: decided and saved (refused: rolled back) before publishing
        update = gate.settle(update, executor)
    publish_update(producer, update)


def _batch_rows(event: BatchBuilt, record: Record, assembler: BatchRowsAssembler) -> list[dict]:
    """The rows of `event`: its assembled, verified chunks; before 1.5 (`chunks == 0`) its file."""
    if event.chunks:
        return assembler.take(event, record)
    return read_rows(event.path) if event.row_count else []

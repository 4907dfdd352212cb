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
from consumers.training.config import TrainRunConfig
from consumers.training.executor import TrainingExecutor
from schemas import topics
from schemas.codec import decode, encode
from schemas.events import BatchBuilt, PolicyUpdated
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


def train_file(run: TrainRunConfig) -> PolicyUpdated | None:
    """Train once on `run.batch`; returns the `policy.updated` event (published unless
    `run.publish` is false), or None when every GRPO group was too stale (no version made)."""
    data, batch_id, method = resolve_batch(Path(run.batch or ""), run.method)
    executor = TrainingExecutor(run.train, run.data_dir)
    event = executor.train_batch(read_rows(data), method, batch_id)
    if event is not None and run.publish:
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
    return event


def follow(run: TrainRunConfig) -> int:
    """Train on every `batch.built` of `run.follow_kinds()` until SIGTERM (or `run.idle_exit_s`)."""
    stop = {"now": False}
    # the caller's SIGTERM handler comes back when following ends (a test runner's, for one)
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    try:
        ensure_topics(run.bootstrap_servers)
        executor = TrainingExecutor(run.train, run.data_dir)
        producer = make_producer(run.bootstrap_servers, CLIENT_ID)
        publish_unpublished(run.bootstrap_servers, producer, executor.state.last_event)
        consumer = make_consumer(run.bootstrap_servers, CLIENT_ID, run.group_id)
        try:
            trainer = BatchTrainer(executor, producer, run.follow_kinds())
            loop = ConsumeLoop(consumer, producer, trainer, _loop_config(run))
            loop.committed.update(assign_from_committed(consumer, [topics.TRAINING_BATCHES]))
            loop.run(lambda: stop["now"])
        finally:
            consumer.close()
            producer.close()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _loop_config(run: TrainRunConfig) -> LoopConfig:
    # one batch per cycle: its offset is committed right after its version is announced
    return LoopConfig(STAGE, "cannot train on this record", 500, 1, run.idle_exit_s)


def publish_unpublished(bootstrap_servers: str, producer, last_event: dict | None) -> bool:
    """Publish the latest checkpoint's `policy.updated` unless `policy.updates` already has it (by
    event id, or by policy version: a version is announced once). True when it published."""
    if not last_event:
        return False
    event = PolicyUpdated.model_validate(last_event)
    for record in _policy_updates(bootstrap_servers):
        if record.get("event_id") == event.event_id or record.get("policy_version") == event.policy_version:
            log.info("executor: %s already published, not publishing it again", event.policy_version)
            return False
    log.info("executor: publishing %s (checkpointed, not yet published)", event.policy_version)
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
    """The loop's handler: train on each `batch.built` of `kinds` and announce the version. A record
    that can never train (undecodable, its batch file missing or unreadable, rows the executor
    refuses) raises and is dead-lettered by the loop with its coordinates, so its offset is committed
    and the follower goes on; the broker, the disk and the device failing raise past the loop (the
    process exits; the record is read again)."""

    def __init__(self, executor: TrainingExecutor, producer, kinds: tuple[str, ...]):
        self.executor, self.producer, self.kinds = executor, producer, kinds

    def handle(self, record: Record, now: float) -> None:
        _train_event(self.executor, self.producer, record, self.kinds)

    def write(self, now: float, force: bool) -> bool:
        return False  # a version is checkpointed and announced inside `handle`

    def commit_positions(self, consumed: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        return consumed


def _train_event(executor: TrainingExecutor, producer, record, kinds: tuple[str, ...]) -> None:
    event = decode(record.value)
    if not isinstance(event, BatchBuilt) or event.kind not in kinds:
        return
    if event.batch_id in executor.state.batches:
        log.info("executor: %s already trained (replay), skipping", event.batch_id)
        return
    rows = read_rows(event.path)
    if not rows:
        log.info("executor: %s has no rows, skipping", event.batch_id)
        return
    update = executor.train_batch(
        rows, KINDS[event.kind].method, event.batch_id, source_ranges=event.source_ranges
    )
    if update is None:  # every group too stale: no version was made, nothing to announce
        log.info("executor: %s made no version (every group dropped as stale)", event.batch_id)
        return
    publish_update(producer, update)

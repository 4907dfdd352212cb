"""The executor's I/O shell: train on one batch file, or follow `training.batches`.

Follow mode is effectively-once per batch: the checkpoint's `state.json` lists the batches already
trained (skipped on replay); the `policy.updated` of the latest checkpoint is re-published on start
(same deterministic event id) in case the process died between checkpoint and publish; the offset
is committed after both.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

from clients.kafka import ensure_topics, make_consumer, make_producer
from consumers.errors import TrainerError
from consumers.trainer.batch_writer import load_manifest, read_rows
from consumers.trainer.config import TrainRunConfig
from consumers.trainer.executor import TrainingExecutor
from consumers.trainer.kinds import KINDS
from schemas import topics
from schemas.codec import decode, encode
from schemas.errors import DecodeError
from schemas.events import BatchBuilt, PolicyUpdated

log = logging.getLogger(__name__)

CLIENT_ID = "trainer-executor"


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


def train_file(run: TrainRunConfig) -> PolicyUpdated:
    """Train once on `run.batch`; returns the `policy.updated` event (published unless
    `run.publish` is false)."""
    data, batch_id, method = resolve_batch(Path(run.batch or ""), run.method)
    executor = TrainingExecutor(run.train, run.data_dir)
    event = executor.train_batch(read_rows(data), method, batch_id)
    if run.publish:
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
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    ensure_topics(run.bootstrap_servers)
    executor = TrainingExecutor(run.train, run.data_dir)
    producer = make_producer(run.bootstrap_servers, CLIENT_ID)
    if executor.state.last_event:
        publish_update(producer, PolicyUpdated.model_validate(executor.state.last_event))
    consumer = make_consumer(run.bootstrap_servers, CLIENT_ID, run.group_id)
    try:
        _assign_from_committed(consumer)
        _follow_loop(consumer, executor, producer, run, stop)
    finally:
        consumer.close()
        producer.close()
    return 0


def _assign_from_committed(consumer) -> None:
    from kafka import TopicPartition

    parts = [
        TopicPartition(topics.TRAINING_BATCHES, p)
        for p in sorted(consumer.partitions_for_topic(topics.TRAINING_BATCHES) or ())
    ]
    consumer.assign(parts)
    for tp in parts:
        committed = consumer.committed(tp)
        if committed is not None:
            consumer.seek(tp, committed)


def _follow_loop(consumer, executor: TrainingExecutor, producer, run: TrainRunConfig, stop: dict) -> None:
    from kafka.structs import OffsetAndMetadata

    kinds = run.follow_kinds()
    last = time.monotonic()
    while not stop["now"]:
        polled = consumer.poll(timeout_ms=500, max_records=1)
        for tp, records in polled.items():
            for record in records:
                _train_record(executor, producer, record, kinds)
                consumer.commit({tp: OffsetAndMetadata(record.offset + 1, "", -1)})
            last = time.monotonic()
        if run.idle_exit_s is not None and not polled and time.monotonic() - last >= run.idle_exit_s:
            log.info("executor: idle for %.1fs, exiting", run.idle_exit_s)
            return


def _train_record(executor: TrainingExecutor, producer, record, kinds: tuple[str, ...]) -> None:
    try:
        event = decode(record.value)
    except DecodeError as exc:
        log.warning("executor: skipping undecodable record at offset %d: %s", record.offset, exc)
        return
    if not isinstance(event, BatchBuilt) or event.kind not in kinds:
        return
    if event.batch_id in executor.state.batches:
        log.info("executor: %s already trained (replay), skipping", event.batch_id)
        return
    rows = read_rows(event.path)
    if not rows:
        log.info("executor: %s has no rows, skipping", event.batch_id)
        return
    update = executor.train_batch(rows, KINDS[event.kind].method, event.batch_id)
    publish_update(producer, update)

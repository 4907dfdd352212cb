"""The executor's I/O shell: train on one batch file, or follow `training.batches`.

Follow mode is effectively-once per batch and publishes each version exactly once:

- the checkpoint's `state.json` lists the batches already trained (skipped on replay), so a batch
  trains at most once per version;
- on start, `policy.updates` is read to its end; the latest checkpoint's `policy.updated` is
  published only when it is not there (the process died between checkpoint and publish), so no
  version is skipped and none is published twice;
- the offset of a batch is committed only after its event is acknowledged (or after the executor
  made no version of it: every group dropped as stale).
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
from schemas.codec import decode, encode, encode_key
from schemas.deadletter import record_dead_letter
from schemas.events import BatchBuilt, PolicyUpdated
from schemas.records import Record

log = logging.getLogger(__name__)

CLIENT_ID = "trainer-executor"
STAGE = "executor"
MAX_REASON_CHARS = 2_000  # of a dead letter's reason: an exception's text may quote the whole input
POISON_OS_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


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
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    ensure_topics(run.bootstrap_servers)
    executor = TrainingExecutor(run.train, run.data_dir)
    producer = make_producer(run.bootstrap_servers, CLIENT_ID)
    publish_unpublished(run.bootstrap_servers, producer, executor.state.last_event)
    consumer = make_consumer(run.bootstrap_servers, CLIENT_ID, run.group_id)
    try:
        _assign_from_committed(consumer)
        _follow_loop(consumer, executor, producer, run, stop)
    finally:
        consumer.close()
        producer.close()
    return 0


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
    import orjson
    from kafka import TopicPartition

    consumer = make_consumer(bootstrap_servers, CLIENT_ID)
    try:
        parts = [
            TopicPartition(topics.POLICY_UPDATES, p)
            for p in sorted(consumer.partitions_for_topic(topics.POLICY_UPDATES) or ())
        ]
        if not parts:
            return []
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        end, found = consumer.end_offsets(parts), []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in parts):
            if time.monotonic() > deadline:
                raise TrainerError(
                    f"executor: could not read {topics.POLICY_UPDATES} to its end in {timeout_s:.0f}s"
                )
            for tp, batch in consumer.poll(timeout_ms=200).items():
                found += [orjson.loads(m.value) for m in batch if m.offset < end[tp]]
        return found
    finally:
        consumer.close()


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
    """Train on one `batch.built` record; a record that can never train (undecodable, its batch
    file missing or unreadable, rows the executor refuses) is dead-lettered with its coordinates,
    so that its offset is committed and the follower goes on. The broker, the disk and the device
    failing are not the record's fault: they raise (the process exits; the record is read again)."""
    try:
        _train_event(executor, producer, record, kinds)
    except Exception as exc:
        if not _is_poison(exc):
            raise
        _dead_letter(producer, record, exc)


def _is_poison(exc: Exception) -> bool:
    """The record's fault: it fails the same way on every replay.

    >>> _is_poison(FileNotFoundError("x")), _is_poison(ConnectionError()), _is_poison(KeyError("prompt"))
    (True, False, True)
    """
    from kafka.errors import KafkaError

    if isinstance(exc, POISON_OS_ERRORS):
        return True  # the file the event points to is not there, not a file, or not ours to read
    return not isinstance(exc, KafkaError | OSError | MemoryError)


def _dead_letter(producer, record, exc: Exception) -> None:
    source = Record(record.topic, record.partition, record.offset, record.key, record.value)
    reason = f"cannot train on this record: {exc!r}"
    reason = reason if len(reason) <= MAX_REASON_CHARS else reason[:MAX_REASON_CHARS] + "..."
    log.error("executor: dead-lettering %s: %s", source.describe(), reason)
    letter = record_dead_letter(STAGE, source, reason, type(exc).__name__)
    producer.send(topics.DLQ, key=encode_key(letter), value=encode(letter)).get(timeout=30)


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

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

from consumers.trainer.batch_writer import load_manifest, read_rows
from consumers.trainer.errors import TrainerError
from consumers.trainer.executor import METHOD_FOR_KIND, TrainConfig, TrainingExecutor
from schemas import topics
from schemas.codec import decode, encode
from schemas.errors import DecodeError
from schemas.events import BatchBuilt, PolicyUpdated
from schemas.settings import Settings

log = logging.getLogger(__name__)


def resolve_batch(path: Path, method: str | None) -> tuple[Path, str, str]:
    """(data file, batch id, method) for a batch file or a manifest."""
    manifest_path = (
        path
        if path.name.endswith(".manifest.json")
        else path.with_name(path.name.rsplit(".", 1)[0] + ".manifest.json")
    )
    if manifest_path.exists():
        manifest = load_manifest(manifest_path)
        return Path(manifest.path), manifest.batch_id, method or METHOD_FOR_KIND[manifest.kind]
    if not path.exists():
        raise TrainerError(f"--batch: {str(path)!r} does not exist")
    if method is None:
        raise TrainerError(f"--batch: {path.name!r} has no manifest beside it; give --method sft|dpo|grpo")
    return path, path.name.rsplit(".", 1)[0], method


def _producer(settings: Settings):
    from kafka import KafkaProducer

    return KafkaProducer(
        bootstrap_servers=settings.bootstrap_servers, acks="all", client_id="trainer-executor"
    )


def publish_update(producer, event: PolicyUpdated) -> None:
    producer.send(topics.POLICY_UPDATES, key=event.trajectory_id.encode(), value=encode(event)).get(
        timeout=30
    )


def train_file(config: TrainConfig, settings: Settings, path: Path, method: str | None, publish: bool = True):
    """Train once on a batch file; returns the `policy.updated` event (published unless told not to)."""
    data, batch_id, method = resolve_batch(path, method)
    executor = TrainingExecutor(config, settings.data_dir)
    event = executor.train_batch(read_rows(data), method, batch_id)
    if publish:
        from kafka.errors import KafkaError

        try:
            producer = _producer(settings)
            publish_update(producer, event)
            producer.close()
        except KafkaError as exc:
            raise TrainerError(
                f"--bootstrap-servers: could not publish policy.updated to {settings.bootstrap_servers!r} "
                f"({exc}); the checkpoint {event.checkpoint_path} is saved"
            ) from None
    return event


def follow(
    config: TrainConfig, settings: Settings, kinds: tuple[str, ...], group_id: str, idle_exit_s=None
) -> int:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    from clients.kafka import ensure_topics

    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    ensure_topics(settings.bootstrap_servers)
    executor = TrainingExecutor(config, settings.data_dir)
    producer = _producer(settings)
    if executor.state.last_event:
        publish_update(producer, PolicyUpdated.model_validate(executor.state.last_event))
    consumer = KafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers, group_id=group_id, enable_auto_commit=False,
        auto_offset_reset="earliest", client_id="trainer-executor",
    )  # fmt: skip
    parts = [
        TopicPartition(topics.TRAINING_BATCHES, p)
        for p in sorted(consumer.partitions_for_topic(topics.TRAINING_BATCHES) or ())
    ]
    consumer.assign(parts)
    for tp in parts:
        committed = consumer.committed(tp)
        if committed is not None:
            consumer.seek(tp, committed)
    last = time.monotonic()
    try:
        while not stop["now"]:
            polled = consumer.poll(timeout_ms=500, max_records=1)
            for tp, records in polled.items():
                for record in records:
                    _train_record(executor, producer, record, kinds)
                    consumer.commit({tp: OffsetAndMetadata(record.offset + 1, "", -1)})
                last = time.monotonic()
            if idle_exit_s is not None and not polled and time.monotonic() - last >= idle_exit_s:
                log.info("executor: idle for %.1fs, exiting", idle_exit_s)
                break
    finally:
        consumer.close()
        producer.close()
    return 0


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
    update = executor.train_batch(rows, METHOD_FOR_KIND[event.kind], event.batch_id)
    publish_update(producer, update)

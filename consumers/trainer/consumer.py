"""`agentstream trainer`: the kafka-python shell around the planner (I/O only).

Loop: poll `trajectory.scored` -> planner lanes -> for each due batch: write it atomically with its
manifest, publish `batch.built` (acks=all, waited for), mark it published -> commit, per partition,
the lowest offset still pending in any lane. Bad input goes to the DLQ before its offset is committed.

On start: `BatchStore.recover()` (drop unfinished files, learn what is batched), re-publish
manifests whose event may be missing (same deterministic event id), then resume from the committed
offsets; replay rebuilds pending groups and skips trajectories already in a manifest. Partitions are
assigned manually (no group rebalancing): the trainer is one process, because a GRPO group spans
partitions. `policy.updates` is always read from the beginning to know the current policy version
and training step (staleness and horizon schedules).
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import Any

from clients.kafka import ensure_topics, make_consumer, make_producer
from consumers.errors import TrainerError
from consumers.trainer.batch_writer import BatchStore, Recovered
from consumers.trainer.config import TrainerConsumerConfig
from consumers.trainer.planner import PlannedBatch, Planner
from schemas import topics
from schemas.codec import decode, encode
from schemas.deadletter import record_dead_letter
from schemas.errors import DecodeError
from schemas.events import BatchBuilt, PolicyUpdated, TrajectoryScored
from schemas.records import Record

log = logging.getLogger(__name__)

STAGE = "trainer"
MAX_REASON_CHARS = 2_000  # of a dead letter's reason: an exception's text may quote the whole input


def run_trainer(config: TrainerConsumerConfig) -> int:
    """`agentstream trainer`: load the tokenizer the kinds need, then consume until SIGTERM."""
    tokenizer = load_tokenizer(config.tokenizer, config.data_dir)
    return TrainerConsumer(config, tokenizer).run()


def load_tokenizer(spec: str | None, data_dir: Path):
    """A tokenizer from a local directory, or the tiny one built under `data_dir` (`'tiny'`)."""
    if not spec:
        return None
    from transformers import AutoTokenizer

    from consumers.trainer.tiny import tiny_model_dir

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


class TrainerConsumer:
    """The trainer consumer process."""

    def __init__(self, options: TrainerConsumerConfig, tokenizer: Any = None):
        self.options, self.config = options, options.planner
        self.store = BatchStore(options.data_dir)
        recovered = self.store.recover()
        ids, hashes = known_state(recovered)
        self.planner = Planner(options.planner, ids, hashes, tokenizer)
        self._unpublished = recovered.unpublished
        self._stop = False
        self.consumed: dict[tuple[str, int], int] = {}
        self._committed: dict[tuple[str, int], int] = {}

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

    def _assign(self) -> None:
        from kafka import TopicPartition

        parts = []
        for topic in (topics.TRAJECTORY_SCORED, topics.POLICY_UPDATES):
            found = self.consumer.partitions_for_topic(topic) or set()
            parts += [TopicPartition(topic, p) for p in sorted(found)]
        self.consumer.assign(parts)
        for tp in parts:
            if tp.topic == topics.POLICY_UPDATES:
                self.consumer.seek_to_beginning(tp)
                continue
            committed = self.consumer.committed(tp)
            if committed is not None:
                self.consumer.seek(tp, committed)
                self._committed[(tp.topic, tp.partition)] = committed
        log.info("trainer: assigned %d partitions", len(parts))

    def publish(self, event, topic: str) -> None:
        key = event.trajectory_id.encode()
        self.producer.send(topic, key=key, value=encode(event)).get(timeout=30)

    def republish(self) -> None:
        for manifest in self._unpublished:
            log.info("recovery: re-publishing batch.built for %s", manifest.batch_id)
            self.publish(manifest.event(), topics.TRAINING_BATCHES)
            self.store.mark_published(manifest)
        self._unpublished = []

    def run(self) -> int:
        from kafka.errors import KafkaError

        signal.signal(signal.SIGTERM, self._on_term)
        ensure_topics(self.options.bootstrap_servers)
        self._clients()
        try:
            self.republish()
            self._assign()
            self._loop()
        except KafkaError as exc:
            log.error("trainer: kafka error, exiting so a supervisor restarts us: %s", exc)
            return 1
        finally:
            self._close()
        return 0

    def _on_term(self, *_: object) -> None:
        self._stop = True

    def _loop(self) -> None:
        last_input = time.monotonic()
        while not self._stop:
            polled = self.consumer.poll(
                timeout_ms=self.options.poll_timeout_ms, max_records=self.options.max_records
            )
            now = time.monotonic()
            for tp, records in polled.items():
                for record in records:
                    self._handle(tp.topic, tp.partition, record, now)
            if polled:
                last_input = now
            flushed = self.flush(now)
            self._commit()
            idle = self.options.idle_exit_s
            if idle is not None and not polled and not flushed and now - last_input >= idle:
                if self.flush(now, force=True):
                    self._commit()
                    continue
                log.info("trainer: idle for %.1fs with nothing due, exiting", idle)
                return

    def _handle(self, topic: str, partition: int, record, now: float) -> None:
        self.consumed[(topic, partition)] = record.offset + 1
        try:
            event = decode(record.value)
        except DecodeError as exc:
            self._dead_letter(exc.reason, "DecodeError", topic, partition, record)
            return
        except Exception as exc:  # a parser's own limit (e.g. RecursionError): the record's fault
            self._dead_letter(f"not decodable: {exc!r}", type(exc).__name__, topic, partition, record)
            return
        if topic == topics.POLICY_UPDATES:
            self.consumed.pop((topic, partition), None)  # re-read from the start each run; never committed
            if isinstance(event, PolicyUpdated):
                self.planner.policy_updated(event.policy_version, event.step)
            return
        if not isinstance(event, TrajectoryScored):
            reason = f"type: expected trajectory.scored on {topic}, got {event.type!r}"
            self._dead_letter(reason, "WrongEventType", topic, partition, record)
            return
        try:
            self.planner.offer(event, Record(topic, partition, record.offset), now)
        except Exception as exc:  # pure planning over a decoded event: it fails the same way every time
            self._dead_letter(f"cannot be planned: {exc!r}", type(exc).__name__, topic, partition, record)

    def _dead_letter(self, reason: str, error_type: str, topic: str, partition: int, record) -> None:
        reason = reason if len(reason) <= MAX_REASON_CHARS else reason[:MAX_REASON_CHARS] + "..."
        log.warning("trainer: dead-lettering %s[%d]@%d: %s", topic, partition, record.offset, reason)
        source = Record(topic, partition, record.offset, record.key, record.value)
        letter = record_dead_letter(STAGE, source, reason, error_type)
        self.publish(letter, topics.DLQ)

    def flush(self, now: float, force: bool = False) -> list[BatchBuilt]:
        """Write, publish and mark every due batch; returns the events published."""
        published = []
        while batches := self.planner.due(now, force):
            for batch in batches:
                published.append(self._commit_batch(batch))
        return published

    def _commit_batch(self, batch: PlannedBatch) -> BatchBuilt:
        manifest = self.store.write(batch.kind, batch.rows, batch.meta(), fmt=self.options.format)
        event = manifest.event()
        self.publish(event, topics.TRAINING_BATCHES)
        self.store.mark_published(manifest)
        self.planner.committed(batch)
        return event

    def _commit(self) -> None:
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        positions = self.planner.commit_positions(self.consumed)
        changed = {tp: off for tp, off in positions.items() if self._committed.get(tp) != off}
        if not changed:
            return
        self.consumer.commit(
            {TopicPartition(*tp): OffsetAndMetadata(off, "", -1) for tp, off in changed.items()}
        )
        self._committed.update(changed)

    def _close(self) -> None:
        for client in (getattr(self, "consumer", None), getattr(self, "producer", None)):
            if client is not None:
                try:
                    client.close()
                except Exception:  # closing after a broker failure must not hide the original error
                    log.debug("trainer: error while closing a client", exc_info=True)

"""The sink worker: a kafka-python consumer group over every registry topic, into ClickHouse.

Loop: poll -> decode (schemas.codec) -> rows (consumers.sink.rows, pure) -> ClickHouseSink buffer;
every `batch_rows` rows or `flush_interval_s` seconds: insert, publish dead letters, and only then
commit the offsets that batch covered. A crash at any point re-delivers from the last commit, and the
tables deduplicate what was written twice. Undecodable records and unwritable rows go to the DLQ topic
(`stage="sink"`); dead letters that arrive on the DLQ topic itself land in `dead_letters` (a broken
record on the DLQ is written there directly, never re-published, so there is no loop).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from consumers.sink.base import Rejected, Source
from consumers.sink.clickhouse import ClickHouseSink
from consumers.sink.rows import dead_letter_row, rows_for
from schemas.codec import decode, encode, encode_key
from schemas.deadletter import dead_letter
from schemas.errors import DecodeError
from schemas.events import DeadLetter
from schemas.topics import DLQ, TOPICS

log = logging.getLogger(__name__)

STAGE = "sink"
GROUP_ID = "agentstream-sink"


@dataclass(frozen=True)
class SinkConfig:
    bootstrap_servers: str
    clickhouse_url: str
    group_id: str = GROUP_ID
    topics: tuple[str, ...] = field(default_factory=lambda: tuple(TOPICS))
    batch_rows: int = 5000
    flush_interval_s: float = 0.5
    max_retry_s: float = 300.0
    from_beginning: bool = False
    endpoint_port: int = 0
    session_timeout_ms: int = 10_000


class SinkWorker:
    """One sink process's state: consumer, DLQ producer, ClickHouse sink, uncommitted offsets."""

    def __init__(self, config: SinkConfig, client, consumer, producer):
        self.config = config
        self.sink = ClickHouseSink(client, max_retry_s=config.max_retry_s)
        self.consumer = consumer
        self.producer = producer
        self._offsets: dict = {}
        self._dead: list[DeadLetter] = []
        self._records = 0
        self._last_flush = time.monotonic()
        self.stats = {"records": 0, "rows": 0, "dead_letters": 0, "flushes": 0}

    def handle(self, record) -> None:
        """Turn one Kafka record into buffered rows (or a dead letter)."""
        from kafka import TopicPartition

        source = Source(
            record.topic, record.partition, record.offset, record.key, record.value or b"", record.timestamp
        )
        self._offsets[TopicPartition(record.topic, record.partition)] = record.offset + 1
        self._records += 1
        try:
            event = decode(source.value)
        except DecodeError as exc:
            self._reject_record(source, str(exc), "DecodeError")
            return
        for table, row in rows_for(event, source.value, record.topic, record.partition, record.offset):
            self.sink.add(table, row, source)

    def _reject_record(self, source: Source, reason: str, error_type: str) -> None:
        letter = _dead_letter(source, reason, error_type)
        log.warning(
            "dead letter topic=%s partition=%d offset=%d trajectory=%s: %s",
            source.topic,
            source.partition,
            source.offset,
            letter.trajectory_id,
            reason,
        )
        if source.topic == DLQ:
            self.sink.add("dead_letters", dead_letter_row(letter), source)  # never re-publish to the DLQ
        else:
            self._dead.append(letter)

    def due(self) -> bool:
        if self.sink.pending >= self.config.batch_rows:
            return True
        return bool(self._offsets) and time.monotonic() - self._last_flush >= self.config.flush_interval_s

    def flush(self) -> None:
        """Insert, publish dead letters, then commit: in that order, so nothing is lost."""
        self._last_flush = time.monotonic()
        if not self._offsets:
            return
        rows = self.sink.pending
        rejected = self.sink.flush()
        if rejected:
            self._dead_letter_rows(rejected)
        self._publish_dead_letters()
        self._commit()
        self.stats["records"] += self._records
        self.stats["rows"] += rows
        self.stats["flushes"] += 1
        self._records = 0

    def _dead_letter_rows(self, rejected: list[Rejected]) -> None:
        for item in rejected:
            self._reject_record(item.source, item.reason, item.error_type)
        retry = self.sink.flush()  # dead letters of DLQ-topic records go straight to dead_letters
        for item in retry:
            log.error(
                "dead letter from topic=%s partition=%d offset=%d could not be written either: %s",
                item.source.topic,
                item.source.partition,
                item.source.offset,
                item.reason,
            )

    def _publish_dead_letters(self) -> None:
        if not self._dead:
            return
        futures = [self.producer.send(DLQ, key=encode_key(d), value=encode(d)) for d in self._dead]
        self.producer.flush()
        for future in futures:
            future.get(timeout=30)  # raises if the broker did not take it: then we must not commit
        self.stats["dead_letters"] += len(self._dead)
        self._dead.clear()

    def forget_offsets(self) -> None:
        self._offsets.clear()
        self._records = 0

    def _commit(self) -> None:
        from kafka.structs import OffsetAndMetadata

        offsets = {tp: OffsetAndMetadata(offset, "", -1) for tp, offset in self._offsets.items()}
        self.consumer.commit(offsets)
        self._offsets.clear()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            batches = self.consumer.poll(timeout_ms=100, max_records=self.config.batch_rows)
            for records in batches.values():
                for record in records:
                    self.handle(record)
            if self.due():
                self.flush()
        self.flush()


def _dead_letter(source: Source, reason: str, error_type: str) -> DeadLetter:
    letter = dead_letter(
        STAGE,
        reason,
        source.value,
        topic=source.topic,
        partition=source.partition,
        offset=source.offset,
        key=source.key,
        error_type=error_type,
    )
    if source.timestamp_ms is None or source.timestamp_ms < 0:
        return letter
    # Stamped with the source record's time, so a replay re-creates the identical dead letter.
    when = datetime.fromtimestamp(source.timestamp_ms / 1000, UTC)
    return letter.model_copy(update={"occurred_at": when})


def _rebalance_listener(worker_ref: list):
    from kafka import ConsumerRebalanceListener

    class FlushOnRevoke(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            from kafka.errors import KafkaError

            if not worker_ref:
                return
            try:
                worker_ref[0].flush()  # commit what we consumed before someone else takes over
            except KafkaError as exc:
                # the rows are written; the new owner re-reads them and the tables deduplicate
                log.warning("commit on revocation failed (%s); the next owner will re-deliver", exc)
                worker_ref[0].forget_offsets()

        def on_partitions_assigned(self, assigned):
            log.info("sink assigned %d partitions", len(assigned))

    return FlushOnRevoke()


def make_consumer(config: SinkConfig, listener):
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        bootstrap_servers=config.bootstrap_servers,
        group_id=config.group_id,
        client_id=f"{config.group_id}-consumer",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=config.batch_rows,
        session_timeout_ms=config.session_timeout_ms,
        heartbeat_interval_ms=max(1000, config.session_timeout_ms // 3),
    )
    consumer.subscribe(topics=list(config.topics), listener=listener)
    return consumer


def make_producer(config: SinkConfig):
    from kafka import KafkaProducer

    return KafkaProducer(
        bootstrap_servers=config.bootstrap_servers,
        client_id=f"{config.group_id}-dlq",
        acks="all",
        linger_ms=5,
    )


def rewind_group(config: SinkConfig) -> None:
    """Commit offset 0 on every partition for the sink's group (a full replay on next start)."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer(
        bootstrap_servers=config.bootstrap_servers, group_id=config.group_id, enable_auto_commit=False
    )
    try:
        partitions = [
            TopicPartition(topic, p)
            for topic in config.topics
            for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        consumer.assign(partitions)
        beginnings = consumer.beginning_offsets(partitions)
        consumer.commit({tp: OffsetAndMetadata(beginnings[tp], "", -1) for tp in partitions})
        log.info("rewound group %s to the beginning of %d partitions", config.group_id, len(partitions))
    finally:
        consumer.close()


def run_sink(config: SinkConfig, stop: threading.Event | None = None, ready=None) -> dict:
    """Run the sink until `stop` is set. Migrates first; serves an embedded chDB path over HTTP."""
    from infra.clickhouse.client import open_and_serve
    from infra.clickhouse.migrate import migrate
    from infra.kafka_clients import ensure_topics

    stop = stop or threading.Event()
    client, endpoint = open_and_serve(config.clickhouse_url, port=config.endpoint_port)
    try:
        migrate(client)
        ensure_topics(config.bootstrap_servers, [TOPICS[t] for t in config.topics])
        if config.from_beginning:
            rewind_group(config)
        worker_ref: list = []
        consumer = make_consumer(config, _rebalance_listener(worker_ref))
        producer = make_producer(config)
        worker = SinkWorker(config, client, consumer, producer)
        worker_ref.append(worker)
        if ready is not None:
            ready(endpoint.url if endpoint else config.clickhouse_url)
        try:
            worker.run(stop)
        finally:
            consumer.close(autocommit=False)
            producer.close()
        return worker.stats
    finally:
        if endpoint is not None:
            endpoint.close()
        client.close()

"""Delivery from the spool to Kafka: the I/O shell around `producers.sdk.spool`. Chunks are sent as
record batches through aiokafka (`clients.kafka.record_batches`); the in-doubt read-back reads the
range with `clients.kafka.ranges` on a kafka-python consumer.

`SpoolDelivery` sends spooled records in sequence order, one chunk at a time, and moves the spool's
delivery cursor only after the broker acknowledged every record of the chunk (acks=all).

Duplicate-free replay (the guarantee, precisely):
  Before a chunk `[first, last]` is sent, the spool's cursor records an *intent*: the range and, for
  every partition of the topics involved, a lower bound of its end offset (the end offsets observed
  at start-up, raised by every acknowledgement since). Whatever part of the chunk the broker stores
  therefore sits at or after those offsets. If the send fails, or the process dies (kill -9) before
  the cursor moved past the chunk, the next attempt - in this process or the next one to open the
  spool slot - reads each partition from its recorded offset to its current end, collects the
  `event_id`s of records carrying the chunk's keys, and re-sends only the chunk's records whose id
  is absent; the intent stays in place until that re-send is acknowledged, so a crash during
  recovery is recovered the same way. Hence every spooled record is stored in the topic exactly once,
  provided (a) one process at a time owns a spool slot (an flock enforces it), (b) the broker does
  not lose records it acknowledged, and (c) event ids are unique per event (the SDK derives them from
  the trajectory id and the step index). Order per trajectory: chunks are sent in sequence order and
  a trajectory's records share one partition; the idempotent producer sends a partition's batches
  in order and keeps that order across retries. Only a record that failed while a *later* record
  of the same partition was stored, in the same chunk, can be re-sent after that later one; the
  steps keep their `step_index`.

Log volume during an outage: the SDK's own lines are one when delivery starts failing, a reminder
every `OUTAGE_REMINDER_S` and one when it works again. The Kafka clients log every retry (aiokafka
retries a pending send every 100 ms with 3-4 ERROR/WARNING lines each: about 1,200 lines on stderr
in a 30-second outage under `logging.basicConfig(level=INFO)`), so the lines the clients log *from
the delivery thread* go through `ClientLogLimiter`: each distinct line (logger, level, format
string) is written at most once per `OUTAGE_REMINDER_S`, the repeats are counted and the SDK's own
outage lines report the count. DEBUG records, and every line the application's own Kafka clients log
from its other threads, pass untouched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from clients.kafka.ranges import ReadIncomplete, iter_range
from clients.kafka.record_batches import RecordBatchError, RecordBatchSender, SenderConfig
from producers.errors import DeliveryFailed
from producers.sdk.spool import Spool, SpoolRecord
from producers.sdk.spool_cursor import Cursor, DeliveryIntent

log = logging.getLogger(__name__)


OUTAGE_REMINDER_S = 60.0
_CLIENT_LOGGERS = ("aiokafka", "kafka")  # the top-level logger names of the two Kafka clients


class ClientLogLimiter(logging.Filter):
    """Writes each distinct INFO-or-above line the Kafka clients log from one thread (the SDK's
    delivery thread) at most once per `window_s`, and counts the repeats it holds back.

    Rate-limiting beats raising the clients' retry backoff: a slower retry still writes a line per
    retry (unbounded in the outage's length) and delays recovery; and it beats raising the clients'
    logger levels, which would also hide the first line of each kind and the application's own
    clients. Attached to the client loggers by `SpoolDelivery`, detached by its `close()`.
    """

    def __init__(self, window_s: float):
        super().__init__()
        self.window_s = window_s
        self.thread_id = threading.get_ident()
        self.suppressed = 0
        self._last_written: dict[tuple[str, int, str], float] = {}
        self._loggers: set[logging.Logger] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread != self.thread_id or record.levelno < logging.INFO:
            return True
        key = (record.name, record.levelno, str(record.msg))  # the format string, not its arguments
        last = self._last_written.get(key)
        if last is not None and record.created - last < self.window_s:
            self.suppressed += 1
            return False
        if len(self._last_written) >= 1024:  # bounded: a client that logs many kinds of line
            self._last_written.clear()
        self._last_written[key] = record.created
        return True

    def attach(self) -> None:
        """Attach to every client logger that exists now. A logger's filter sees only the records
        logged on that logger, not those its children propagate, so each one gets it; called again
        after each (re)connect, since client modules imported later create loggers of their own."""
        for name, logger in list(logging.root.manager.loggerDict.items()):
            ours = isinstance(logger, logging.Logger) and name.split(".", 1)[0] in _CLIENT_LOGGERS
            if ours and logger not in self._loggers:
                logger.addFilter(self)
                self._loggers.add(logger)

    def detach(self) -> None:
        for logger in self._loggers:
            logger.removeFilter(self)
        self._loggers.clear()


@dataclass(frozen=True)
class DeliveryConfig:
    """How the spool talks to Kafka. Producer settings: the project's limits (`clients.kafka`:
    acks=all, idempotence on); records are sent as whole record batches (`clients.kafka.record_batches`),
    so `linger_ms` no longer applies to the SDK's sends (kept for callers that set it)."""

    bootstrap_servers: str
    client_id: str = "agentstream-sdk"
    linger_ms: int = 5
    chunk_records: int = 2000
    chunk_bytes: int = 8 * 1024 * 1024
    request_timeout_ms: int = 10_000
    delivery_timeout_ms: int = 30_000
    connect_timeout_ms: int = 3_000
    retry_backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    create_topics: bool = True


class SpoolDelivery:
    """Delivers one spool to Kafka. Used from one thread (the recorder's delivery thread, or the
    `agentstream spool flush` command)."""

    def __init__(
        self,
        spool: Spool,
        config: DeliveryConfig,
        on_delivered: Callable[[list[SpoolRecord]], None] | None = None,
    ):
        self.spool = spool
        self.config = config
        self.on_delivered = on_delivered
        self._producer = None
        self._consumer = None
        self._bounds: dict[str, dict[int, int]] = {}
        self._topics_ready: set[str] = set()
        # an outage is logged once when it starts, as a reminder every OUTAGE_REMINDER_S, and once
        # when it ends: a retry every few seconds must not write a line each time
        self._outage_since: float | None = None
        self._last_reminder = 0.0
        self._failed_attempts = 0
        self.client_log = ClientLogLimiter(OUTAGE_REMINDER_S)

    # --- one step ---------------------------------------------------------------------------------

    def deliver_once(self) -> int:
        """Deliver the next chunk (or finish an in-doubt one). Returns how many records the broker
        acknowledged; 0 when the spool is drained. Raises on failure (nothing is lost: retry later)."""
        self.client_log.thread_id = threading.get_ident()  # the thread that talks to the broker
        delivered = self._deliver_once()
        if self._outage_since is not None:
            log.warning(
                "spool %s: delivery to %s works again after %.0fs and %d failed attempts "
                "(%d repeated Kafka client log lines held back)",
                self.spool.directory, self.config.bootstrap_servers,
                time.monotonic() - self._outage_since, self._failed_attempts, self.client_log.suppressed,
            )  # fmt: skip
            self._outage_since = None
        return delivered

    def _deliver_once(self) -> int:
        intent = self.spool.cursor.intent
        if intent is not None:
            return self._recover(intent)
        start = self.spool.cursor.delivered
        chunk = self.spool.read(start, self.config.chunk_records, self.config.chunk_bytes)
        if not chunk:
            return 0
        self._get_producer()  # fails fast (connect_timeout_ms) while the broker is unreachable
        offsets = self._lower_bounds({r.topic for r in chunk})
        self.spool.commit(Cursor(start, DeliveryIntent(chunk[0].seq, chunk[-1].seq, offsets)))
        self._send(chunk)
        self.spool.commit(Cursor(chunk[-1].seq + 1, None))
        self._notify(chunk)
        return len(chunk)

    def _recover(self, intent: DeliveryIntent) -> int:
        """Re-send the records of an in-doubt chunk that the topic does not hold yet."""
        size = intent.last - intent.first + 1
        self._get_producer()
        chunk = self.spool.read(intent.first, size, max_bytes=1 << 62)
        present = self._event_ids_since(intent.offsets, {r.key for r in chunk})
        missing = [r for r in chunk if r.event_id not in present]
        log.info(
            "spool %s: recovering in-doubt records %d..%d: %d already in the topic, re-sending %d",
            self.spool.directory, intent.first, intent.last, len(chunk) - len(missing), len(missing),
        )  # fmt: skip
        self._send(missing)
        self.spool.commit(Cursor(intent.last + 1, None))
        self._notify(chunk)
        return len(chunk)

    def _notify(self, chunk: list[SpoolRecord]) -> None:
        if self.on_delivered is not None:
            self.on_delivered(chunk)

    # --- Kafka I/O --------------------------------------------------------------------------------

    def _send(self, records: list[SpoolRecord]) -> None:
        if not records:
            return
        self._ensure_topics({r.topic for r in records})
        try:
            sent = self._get_producer().send([(r.topic, r.key, r.value) for r in records])
        except RecordBatchError as exc:
            first = records[exc.index] if exc.index is not None else records[0]
            raise DeliveryFailed(f"event {first.event_id} (seq {first.seq}) and after: {exc}") from None
        for topic, ends in sent.items():
            bounds = self._bounds.setdefault(topic, {})
            for partition, end in ends.items():
                bounds[partition] = max(bounds.get(partition, 0), end)

    def _lower_bounds(self, topics: set[str]) -> dict[str, dict[int, int]]:
        """A lower bound of each partition's end offset for `topics` (queried once, then raised by
        every acknowledgement)."""
        missing = [t for t in topics if t not in self._bounds]
        if missing:
            self._ensure_topics(set(missing))
            consumer = self._get_consumer()
            from kafka import TopicPartition

            for topic in missing:
                partitions = consumer.partitions_for_topic(topic) or set()
                if not partitions:
                    raise DeliveryFailed(f"topic {topic!r} has no partitions (does it exist?)")
                ends = consumer.end_offsets([TopicPartition(topic, p) for p in partitions])
                current = self._bounds.get(topic, {})
                self._bounds[topic] = {
                    tp.partition: max(o, current.get(tp.partition, 0)) for tp, o in ends.items()
                }
            self._release_consumer()
        return {t: dict(self._bounds[t]) for t in topics}

    def _event_ids_since(self, offsets: dict[str, dict[int, int]], keys: set[bytes]) -> set[str]:
        """The event ids of records with one of `keys` stored at or after `offsets`."""
        from kafka import TopicPartition

        partitions = [TopicPartition(t, p) for t, parts in offsets.items() for p in parts]
        if not partitions:
            return set()
        try:
            return self._read_event_ids(partitions, offsets, keys)
        finally:
            self._release_consumer()

    def _read_event_ids(
        self, partitions: list, offsets: dict[str, dict[int, int]], keys: set[bytes]
    ) -> set[str]:
        start = {tp: offsets[tp.topic][tp.partition] for tp in partitions}
        timeout_s = self.config.delivery_timeout_ms / 1000
        try:
            records = iter_range(self._get_consumer(), partitions, start, timeout_s=timeout_s, strict=True)
            return {_event_id(r.value) for r in records if r.key in keys}
        except ReadIncomplete as exc:
            raise DeliveryFailed(f"reading back {partitions} to check for in-doubt events: {exc}") from None

    def _ensure_topics(self, topics: set[str]) -> None:
        todo = topics - self._topics_ready
        if not todo:
            return
        if self.config.create_topics:
            from clients.kafka import ensure_topics
            from schemas.topics import TOPICS

            specs = [TOPICS[t] for t in todo if t in TOPICS]
            ensure_topics(
                self.config.bootstrap_servers, specs, timeout_s=self.config.connect_timeout_ms / 1000
            )
        self._topics_ready |= todo

    def _get_producer(self) -> RecordBatchSender:
        """The connected batch sender; raises within `connect_timeout_ms` while the broker is away."""
        fresh = self._producer is None
        if fresh:
            cfg = self.config
            self._producer = RecordBatchSender(
                SenderConfig(
                    cfg.bootstrap_servers,
                    cfg.client_id,
                    request_timeout_ms=cfg.request_timeout_ms,
                    delivery_timeout_ms=cfg.delivery_timeout_ms,
                    connect_timeout_ms=cfg.connect_timeout_ms,
                )
            )
            self.client_log.attach()  # before connecting: that is where a down broker is logged
        try:
            self._producer.connect()
        except RecordBatchError as exc:
            raise DeliveryFailed(str(exc)) from None
        finally:
            if fresh:
                self.client_log.attach()  # the loggers of the client modules a first connect imports
        return self._producer

    def _get_consumer(self):
        if self._consumer is None:
            from clients.kafka import make_consumer

            cfg = self.config
            self._consumer = make_consumer(
                cfg.bootstrap_servers,
                cfg.client_id + "-readback",
                request_timeout_ms=cfg.request_timeout_ms + 1000,
                bootstrap_timeout_ms=cfg.connect_timeout_ms,
                reconnect_backoff_max_ms=1000,
            )
        return self._consumer

    def _release_consumer(self) -> None:
        """Close the read-back consumer between its rare uses (start-up, in-doubt recovery): an idle
        kafka-python client keeps a network thread busy."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close()
            except Exception:
                log.debug("error closing the read-back consumer", exc_info=True)

    def reset(self) -> None:
        """Drop the clients after a failure; the next attempt reconnects."""
        producer, consumer = self._producer, self._consumer
        self._producer = self._consumer = None
        self._topics_ready.clear()
        for client in (producer, consumer):
            if client is not None:
                try:
                    client.close()
                except Exception:  # closing a broken client must not mask the original failure
                    log.debug("error closing a kafka client", exc_info=True)

    def close(self) -> None:
        """Drop the clients and stop filtering their log lines."""
        self.reset()
        self.client_log.detach()

    # --- loops ------------------------------------------------------------------------------------

    def drain(self, timeout_s: float, stop: threading.Event | None = None) -> bool:
        """Deliver until the spool is empty (True) or `timeout_s` passed / `stop` was set (False)."""
        deadline = time.monotonic() + timeout_s
        backoff = self.config.retry_backoff_s
        while self.spool.pending > 0:
            if time.monotonic() > deadline or (stop is not None and stop.is_set()):
                return False
            try:
                self.deliver_once()
                backoff = self.config.retry_backoff_s
            except Exception as exc:
                backoff = self.backoff_after_failure(exc, backoff, deadline - time.monotonic(), stop)
        return True

    def backoff_after_failure(self, exc: BaseException, backoff: float, left_s: float, stop) -> float:
        self._log_failure(exc, backoff)
        self.reset()
        pause = max(0.0, min(backoff, left_s))
        if stop is not None:
            stop.wait(pause)
        else:
            time.sleep(pause)
        return min(backoff * 2, self.config.max_backoff_s)

    def _log_failure(self, exc: BaseException, backoff: float) -> None:
        now = time.monotonic()
        self._failed_attempts = self._failed_attempts + 1 if self._outage_since is not None else 1
        where = f"spool {self.spool.directory}: delivery to {self.config.bootstrap_servers}"
        if self._outage_since is None:
            self._outage_since = self._last_reminder = now
            log.warning(
                "%s failed, %d events kept in the spool, retrying with backoff (next reminder in %.0fs "
                "unless it recovers): %s", where, self.spool.pending, OUTAGE_REMINDER_S, exc,
            )  # fmt: skip
        elif now - self._last_reminder >= OUTAGE_REMINDER_S:
            self._last_reminder = now
            log.warning(
                "%s still failing after %.0fs and %d attempts, %d events kept in the spool "
                "(%d repeated Kafka client log lines held back): %s",
                where, now - self._outage_since, self._failed_attempts, self.spool.pending,
                self.client_log.suppressed, exc,
            )  # fmt: skip
        else:
            log.debug("%s failed again, retrying in %.1fs: %s", where, backoff, exc)


def _event_id(value: bytes | None) -> str | None:
    try:
        return orjson.loads(value).get("event_id")
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return None

"""The plumbing under `AgentRecorder` (see `producers.sdk.recorder` for the contract it keeps):

    caller thread --put--> EventBuffer --writer thread--> Spool (fsynced) --delivery thread--> Kafka

`EventBuffer` is the bounded hand-off from callers; `RecordingPipeline` owns the spool slot and the
two threads, and answers "spooled yet?" / "delivered yet?" by acceptance number. The recorder
builds and validates events; nothing here knows what an event means.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from producers.errors import ProducerError, RecorderBufferFull, RecorderClosed
from producers.sdk.delivery import DeliveryConfig, SpoolDelivery
from producers.sdk.spool import Spool, SpoolRecord

log = logging.getLogger(__name__)

SDK_VERSION = "0.1.0"
OnFull = Literal["block", "raise"]
Until = Literal["delivered", "spooled"]


@dataclass(frozen=True)
class RecorderConfig:
    """Tuning of the recorder; every field can also be given to `AgentRecorder(...)` by name."""

    buffer_size: int = 10_000
    on_full: OnFull = "block"
    block_timeout_s: float = 10.0
    linger_ms: int = 5
    spool_linger_ms: float = 10.0
    # under load the linger grows with the record rate up to this (`LingerPacing`); None: 4 x spool_linger_ms
    spool_linger_max_ms: float | None = None
    chunk_records: int = 2000
    fsync: bool = True
    segment_bytes: int = 64 * 1024 * 1024
    # undelivered records the delivery thread takes from memory rather than re-reading the spool
    spool_cache_bytes: int = 16 * 1024 * 1024
    policy_ttl_s: float = 5.0
    connect_timeout_ms: int = 3000
    delivery_timeout_ms: int = 30_000
    close_timeout_s: float = 10.0
    max_event_bytes: int = 1_000_000  # Apache Kafka's default message.max.bytes
    producer: str = f"sdk/{SDK_VERSION}"
    # redaction (producers.redaction_settings): None = $AGENTSTREAM_SETTINGS_FILE, else
    # <data_dir>/settings.yaml
    settings_file: str | None = None

    def __post_init__(self):
        if self.on_full not in ("block", "raise"):
            raise ProducerError(f"on_full: expected 'block' or 'raise', got {self.on_full!r}")
        if self.buffer_size < 1:
            raise ProducerError(f"buffer_size: must be at least 1, got {self.buffer_size!r}")
        if not 0 <= self.spool_linger_ms <= 1000:
            raise ProducerError(f"spool_linger_ms: must be between 0 and 1000, got {self.spool_linger_ms!r}")
        high = self.spool_linger_max_ms
        if high is not None and not self.spool_linger_ms <= high <= 1000:
            raise ProducerError(
                f"spool_linger_max_ms: must be between spool_linger_ms ({self.spool_linger_ms!r}) and 1000, "
                f"got {self.spool_linger_max_ms!r}"
            )

    @property
    def linger_range_s(self) -> tuple[float, float]:
        """(at a trickle, under load) seconds the writer and the delivery thread linger for more."""
        low = self.spool_linger_ms
        high = 4 * low if self.spool_linger_max_ms is None else self.spool_linger_max_ms
        return low / 1000, min(high, 1000) / 1000


class LingerPacing:
    """How long the spool writer and the delivery thread linger for more records after a first one:
    `min_s` at a trickle, growing linearly with the record rate (a moving average over the writer's
    batches) from `LOW_RATE` records/s to `max_s` at `HIGH_RATE` and above. Each batch costs a spool
    fsync, a produce request and two cursor fsyncs whatever its size, so under load a longer linger
    saves CPU here and at the broker; at a trickle there is little to save and a wait would only add
    latency.

    >>> pacing = LingerPacing(0.01, 0.04)
    >>> pacing.seconds
    0.01
    >>> for t in range(1, 30):
    ...     pacing.observe(20, t * 0.04)  # 500 records/s
    >>> round(pacing.seconds, 3)
    0.04
    """

    LOW_RATE = 50.0
    HIGH_RATE = 250.0
    SMOOTHING = 0.2

    def __init__(self, min_s: float, max_s: float):
        self.min_s, self.max_s = min_s, max(min_s, max_s)
        self.rate = 0.0  # records per second, a moving average over the batches
        self._last: float | None = None

    def observe(self, records: int, now: float) -> None:
        """A batch of `records` was taken at `now` (monotonic seconds)."""
        if self._last is not None:
            sample = records / max(now - self._last, 0.001)
            self.rate += self.SMOOTHING * (sample - self.rate)
        self._last = now

    @property
    def seconds(self) -> float:
        load = min(max((self.rate - self.LOW_RATE) / (self.HIGH_RATE - self.LOW_RATE), 0.0), 1.0)
        return self.min_s + load * (self.max_s - self.min_s)


class EventBuffer:
    """A bounded FIFO between callers and the writer thread.

    >>> buf = EventBuffer(1)
    >>> buf.put("a", "raise")
    1
    >>> try:
    ...     buf.put("b", "raise")
    ... except RecorderBufferFull as exc:
    ...     print(exc.capacity)
    1
    """

    def __init__(self, capacity: int, batch_items: int | None = None):
        self.capacity = capacity
        self.batch_items = batch_items or capacity  # a taker lingering for a batch wakes at this many
        self._items: deque = deque()
        self._cond = threading.Condition()
        self.accepted = 0
        self.closed = False

    def put(self, item: Any, on_full: OnFull = "block", timeout_s: float = 10.0) -> int:
        """Append `item`; returns its 1-based acceptance number."""
        with self._cond:
            if self.closed:
                raise RecorderClosed("the recorder is closed; create a new one to record more events")
            if len(self._items) >= self.capacity:
                if on_full == "raise":
                    raise RecorderBufferFull(self.capacity)
                start = time.monotonic()
                if not self._cond.wait_for(
                    lambda: len(self._items) < self.capacity or self.closed, timeout_s
                ):
                    raise RecorderBufferFull(self.capacity, time.monotonic() - start)
                if self.closed:
                    raise RecorderClosed("the recorder was closed while waiting for buffer room")
            self._items.append(item)
            self.accepted += 1
            if len(self._items) in (1, self.batch_items):  # the taker waits for a first item or a batch
                self._cond.notify_all()
            return self.accepted

    def take(self, max_items: int, wait_s: float, linger_s: float = 0.0) -> list:
        """Up to `max_items` items, waiting up to `wait_s` for the first one, then up to `linger_s`
        for `batch_items` (so a trickle is taken in batches, not one item at a time)."""
        with self._cond:
            if not self._items:
                self._cond.wait_for(lambda: self._items or self.closed, wait_s)
            if self._items and linger_s > 0 and len(self._items) < min(max_items, self.batch_items):
                target = min(max_items, self.batch_items)
                self._cond.wait_for(lambda: len(self._items) >= target or self.closed, linger_s)
            out = [self._items.popleft() for _ in range(min(max_items, len(self._items)))]
            if out:
                self._cond.notify_all()
            return out

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        return len(self._items)


class RecordingPipeline:
    """Buffer, spool writer thread and delivery thread of one recorder (one spool slot under
    `spool_root`). `on_delivered(records)` is called from the delivery thread after each
    acknowledged chunk."""

    def __init__(
        self,
        spool_root: Path,
        config: RecorderConfig,
        delivery_config: DeliveryConfig,
        on_delivered: Callable[[list[SpoolRecord]], None] | None = None,
    ):
        self.config = config
        self.spool = Spool.open_slot(
            spool_root,
            segment_bytes=config.segment_bytes,
            fsync=config.fsync,
            read_cache_bytes=config.spool_cache_bytes,
        )
        self._base_seq = self.spool.end_seq  # acceptance number n is spool sequence base + n - 1
        self._buffer = EventBuffer(config.buffer_size, batch_items=config.chunk_records)
        self.linger = LingerPacing(*config.linger_range_s)
        self._progress = threading.Condition()
        self._spooled_seq = self.spool.end_seq
        self.writer_error: BaseException | None = None
        self._wake = threading.Event()
        self._stop_delivery = threading.Event()
        self.broker_failing = False  # the last delivery attempt failed (the broker is unreachable?)
        self._user_on_delivered = on_delivered
        self._delivery = SpoolDelivery(self.spool, delivery_config, on_delivered=self._on_delivered)
        self._writer = threading.Thread(target=self._write_loop, name="agentstream-spool-writer", daemon=True)
        self._sender = threading.Thread(target=self._deliver_loop, name="agentstream-delivery", daemon=True)
        self._writer.start()
        self._sender.start()
        if self.spool.pending:
            log.info(
                "spool %s: %d undelivered events from an earlier run",
                self.spool.directory,
                self.spool.pending,
            )

    def put(self, record: SpoolRecord, on_full: OnFull | None = None) -> int:
        """Accept one encoded record; returns its acceptance number."""
        if self.writer_error is not None:
            raise ProducerError(
                f"the spool writer failed; nothing more can be recorded: {self.writer_error!r}"
            )
        return self._buffer.put(record, on_full or self.config.on_full, self.config.block_timeout_s)

    # --- threads ----------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            linger_s = self.linger.seconds
            batch = self._buffer.take(max_items=self.config.chunk_records, wait_s=0.1, linger_s=linger_s)
            if not batch:
                if self._buffer.closed and not len(self._buffer):
                    return
                continue
            self.linger.observe(len(batch), time.monotonic())
            try:
                end = self.spool.append(batch)
            except BaseException as exc:  # a full or failing disk: surface to callers, never drop silently
                log.exception("spool %s: cannot write %d events", self.spool.directory, len(batch))
                self.writer_error = exc
                with self._progress:
                    self._progress.notify_all()
                return
            with self._progress:
                self._spooled_seq = end
                self._progress.notify_all()
            self._wake.set()

    def _deliver_loop(self) -> None:
        backoff = self._delivery.config.retry_backoff_s
        while not self._stop_delivery.is_set():
            if self.spool.pending == 0:
                self._wake.wait(0.1)
                self._wake.clear()
                continue
            linger_s = self.linger.seconds
            if self.spool.pending < self.config.chunk_records and linger_s > 0:
                # not a full chunk: let a few more steps join this produce request and its two cursor fsyncs
                self._stop_delivery.wait(linger_s)
            try:
                self._delivery.deliver_once()
                backoff = self._delivery.config.retry_backoff_s
                self.broker_failing = False
            except Exception as exc:
                with self._progress:
                    self.broker_failing = True
                    self._progress.notify_all()
                backoff = self._delivery.backoff_after_failure(exc, backoff, 1e9, self._stop_delivery)

    def _on_delivered(self, records: list[SpoolRecord]) -> None:
        with self._progress:
            self._progress.notify_all()
        if self._user_on_delivered is not None:
            try:
                self._user_on_delivered(records)
            except Exception:
                log.exception("on_delivered callback failed")

    # --- flushing and closing ---------------------------------------------------------------------

    def flush(self, timeout: float | None, until: Until = "delivered", stop_if_failing: bool = False) -> bool:
        """Wait until every record accepted before this call is spooled or delivered; False if
        `timeout` seconds passed first (or, with `stop_if_failing`, once the broker is failing)."""
        target = self._base_seq + self._buffer.accepted

        def done() -> bool:
            if self.writer_error is not None:
                raise ProducerError(f"the spool writer failed: {self.writer_error!r}")
            return self._reached(until) >= target or (stop_if_failing and self.broker_failing)

        self._wake.set()
        with self._progress:
            self._progress.wait_for(done, timeout)
        return self._reached(until) >= target

    def _reached(self, until: Until) -> int:
        return self._spooled_seq if until == "spooled" else self.spool.cursor.delivered

    @property
    def pending(self) -> int:
        """Records accepted but not yet acknowledged by the broker (buffered + spooled)."""
        return len(self._buffer) + self.spool.pending

    def close(self, timeout: float) -> bool:
        """Spool everything buffered, deliver for up to `timeout` seconds, stop the threads.
        True if nothing is left undelivered."""
        deadline = time.monotonic() + timeout
        self._buffer.close()
        self._writer.join()  # local disk only: bounded by the buffer size
        # With the broker failing, do not hold the process up: everything is durable in the spool.
        delivered = self.flush(max(0.0, deadline - time.monotonic()), stop_if_failing=True)
        self._stop_delivery.set()
        self._sender.join(timeout=max(1.0, deadline - time.monotonic()))
        if self._sender.is_alive():
            # Keep the spool locked until this process exits so no other process replays it meanwhile.
            log.warning(
                "spool %s: delivery thread still busy at close; %d events stay spooled",
                self.spool.directory,
                self.spool.pending,
            )
            return False
        self._delivery.close()
        left = self.spool.pending
        self.spool.close()
        if left:
            log.warning(
                "closed with %d events undelivered; they stay in the spool %s", left, self.spool.directory
            )
        return delivered and left == 0

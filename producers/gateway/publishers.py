"""How the gateway sends accepted events to Kafka: one publisher per client library, both built by
`clients.kafka` with the project's limits (acks=all), both answering per record whether the broker
acknowledged it in time. (The broker reachability probe behind `GET /healthz` is
`clients.kafka.broker_reachable`.)"""

from __future__ import annotations

import asyncio
import logging
import time

from producers.gateway.requests import GatewayConfig

log = logging.getLogger(__name__)

CLIENT_ID = "agentstream-gateway"
Records = list[tuple[str, bytes, bytes]]  # (topic, key, value)


class _Publisher:
    """Creates its producer on first use (under a lock: concurrent requests share one), and replaces
    it when a send fails for a reason other than time: a client library can enter a state in which it
    refuses every later send (kafka-python's idempotent producer after an unexpected broker error), and
    one bad record must not leave the gateway answering 503 to everyone. `healthy` is False while the
    last send failed as a whole, for at most `ack_timeout_s` after it (`/healthz` then answers 503; a
    balancer that stops sending requests then still sees the gateway come back)."""

    def __init__(self, config: GatewayConfig):
        self.config = config
        self._producer = None
        self._lock = asyncio.Lock()
        self._failed_at: float | None = None  # monotonic time of the last send that failed whole
        self.replaced = 0  # producers replaced after a failure (tests and logs)

    async def _started(self):
        async with self._lock:
            if self._producer is None:
                self._producer = await self._create()
            return self._producer

    async def _create(self):
        raise NotImplementedError

    @property
    def healthy(self) -> bool:
        failed_at = self._failed_at
        return failed_at is None or time.monotonic() - failed_at > self.config.ack_timeout_s

    async def _send(self, producer, records: Records) -> list[BaseException | None]:
        raise NotImplementedError

    async def _stop(self, producer) -> None:
        raise NotImplementedError

    async def send_all(self, records: Records) -> list[BaseException | None]:
        """Per record: None when the broker acknowledged it, else the exception."""
        producer = await self._started()
        try:
            results = await self._send(producer, records)
        except Exception as exc:
            self._failed_at = time.monotonic()
            await self._replace(producer, exc)
            raise
        failures = [r for r in results if r is not None]
        self._failed_at = time.monotonic() if results and len(failures) == len(results) else None
        fatal = next((r for r in failures if not _retriable(r)), None)
        if fatal is not None:
            await self._replace(producer, fatal)
        return results

    async def _replace(self, producer, reason: BaseException) -> None:
        """Drop `producer` (the next send creates a new one), unless another request already did."""
        async with self._lock:
            if self._producer is not producer:
                return
            self._producer = None
        self.replaced += 1
        log.warning("gateway: replacing the %s producer after: %r", type(self).__name__, reason)
        try:
            await self._stop(producer)
        except Exception as exc:  # it is being dropped: how it closes does not matter
            log.debug("gateway: closing the replaced producer: %r", exc)

    async def close(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await self._stop(producer)


def _retriable(exc: BaseException) -> bool:
    """A failure that time may cure (no acknowledgement yet, broker unreachable): keep the producer."""
    return isinstance(exc, TimeoutError) or bool(getattr(exc, "retriable", False))


class AioKafkaPublisher(_Publisher):
    """Sends through aiokafka (acks=all, idempotence on), natively async. Measured slower than
    `KafkaPythonPublisher` on the embedded broker (`agentstream bench produce`), so not the default."""

    async def _create(self):
        from clients.kafka import make_async_producer

        producer = make_async_producer(
            self.config.bootstrap_servers,
            CLIENT_ID,
            enable_idempotence=True,
            linger_ms=self.config.linger_ms,
            request_timeout_ms=int(self.config.ack_timeout_s * 1000),
        )
        try:
            await producer.start()
        except BaseException:
            await producer.stop()  # release its sockets; the next request tries again
            raise
        return producer

    async def _send(self, producer, records: Records) -> list[BaseException | None]:
        futures = [await producer.send(topic, value=value, key=key) for topic, key, value in records]
        done, _ = (
            await asyncio.wait(futures, timeout=self.config.ack_timeout_s) if futures else (set(), set())
        )
        return [
            (f.exception() or None) if f in done else TimeoutError("no acknowledgement in time")
            for f in futures
        ]

    async def _stop(self, producer) -> None:
        await producer.stop()


class KafkaPythonPublisher(_Publisher):
    """Sends through kafka-python (acks=all, idempotence on), waiting for acks in an executor thread.
    The default: 2-3x the events/s of aiokafka with lower p99 in `agentstream bench produce`."""

    async def _create(self):
        from clients.kafka import make_producer

        ack_ms = int(self.config.ack_timeout_s * 1000)
        return await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: make_producer(
                self.config.bootstrap_servers,
                CLIENT_ID,
                linger_ms=self.config.linger_ms,
                bootstrap_timeout_ms=3000,
                request_timeout_ms=ack_ms,
                delivery_timeout_ms=ack_ms + self.config.linger_ms,
            ),
        )

    async def _send(self, producer, records: Records) -> list[BaseException | None]:
        futures = [producer.send(topic, key=key, value=value) for topic, key, value in records]
        timeout = self.config.ack_timeout_s

        def wait() -> list[BaseException | None]:
            deadline = time.monotonic() + timeout
            out: list[BaseException | None] = []
            for future in futures:
                try:
                    future.get(timeout=max(0.0, deadline - time.monotonic()))
                    out.append(None)
                except Exception as exc:
                    out.append(exc)
            return out

        return await asyncio.get_running_loop().run_in_executor(None, wait)

    async def _stop(self, producer) -> None:
        await asyncio.get_running_loop().run_in_executor(None, lambda: producer.close(timeout=5))


def make_publisher(config: GatewayConfig) -> AioKafkaPublisher | KafkaPythonPublisher:
    return AioKafkaPublisher(config) if config.client == "aiokafka" else KafkaPythonPublisher(config)

"""The broker's network shell: an asyncio TCP server speaking Kafka's size-prefixed framing.

Each connection is served by one coroutine that reads frames and answers them strictly in order,
as Apache Kafka does (clients may pipeline several requests; their bytes wait in the stream
buffer). A frame that is too short, larger than `max_request_bytes`, of an unknown API, or that
cannot be decoded closes only that connection, with one log line; the broker keeps serving every
other client. ApiVersions at an unknown version gets the KIP-511 v0 answer; another API at a
version outside the profile gets UNSUPPORTED_VERSION where its schema has a top-level error code,
and otherwise the connection is closed (what Kafka does).

This module owns sockets, framing and the lifecycle of the background tasks (session reaper,
retention, compaction, interval flushes). Request semantics live in handlers_*.py.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time

from infra.broker.errors import MalformedRequestError
from infra.broker.handlers import HANDLERS
from infra.broker.protocol import (
    API_VERSIONS_KEY,
    RequestHeader,
    decode_request,
    encode_response,
    is_supported,
    peek_header,
    unsupported_api_versions,
    unsupported_version_response,
)
from infra.broker.retention import run_periodically
from infra.broker.state import BrokerState

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
MIN_REQUEST_BYTES = 8  # api_key, api_version, correlation_id
STREAM_BUFFER_BYTES = 1 << 20
MAX_IN_FLIGHT = 32  # requests read ahead per connection before reading pauses


class ConnectionClosed(Exception):
    """Raised inside a connection loop to end it (the reason has been logged)."""


class BrokerServer:
    """Listens on (host, port) and serves Kafka requests against a `BrokerState`."""

    def __init__(self, state: BrokerState) -> None:
        self.state = state
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self._background: list[asyncio.Task] = []

    async def start(self) -> tuple[str, int]:
        cfg = self.state.config
        self._server = await asyncio.start_server(
            self._serve_connection, cfg.host, cfg.port, limit=STREAM_BUFFER_BYTES
        )
        host, port = self._server.sockets[0].getsockname()[:2]
        self.state.advertised_host, self.state.advertised_port = host, port
        self.state.groups.start()
        self.state.commit.start()
        self._start_background()
        log.info("broker listening on %s:%d (data dir %s)", host, port, cfg.data_dir)
        return host, port

    def _start_background(self) -> None:
        cfg, store = self.state.config, self.state.store
        loop = asyncio.get_running_loop()
        retention = run_periodically(
            "retention", cfg.retention_check_interval_ms / 1000, lambda: _apply_retention(store)
        )
        self._background.append(loop.create_task(retention))
        # the log cleaner shares the retention check interval: both are log housekeeping
        compaction = run_periodically(
            "compaction", cfg.log_cleaner_interval_ms / 1000, lambda: store.compact_all(_now_ms())
        )
        self._background.append(loop.create_task(compaction))
        if cfg.flush == "interval":
            flushing = run_periodically("flush", cfg.flush_interval_ms / 1000, store.flush_all)
            self._background.append(loop.create_task(flushing))

    async def close(self) -> None:
        """Stop accepting, end every connection and background task, flush and close storage."""
        if self._server is not None:
            self._server.close()
        for task in [*self._connections, *self._background]:
            task.cancel()
        await asyncio.gather(*self._connections, *self._background, return_exceptions=True)
        await self.state.groups.close()
        await self.state.commit.close()
        self.state.store.flush_all()
        self.state.store.close()
        log.info("broker stopped; storage flushed and closed")

    # -- one connection --------------------------------------------------------------------------

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read frames and start answering each at once; a second coroutine writes answers in order.

        Requests start in arrival order and run until their first wait (a produce appends before it
        waits for its fsync), so pipelined produces share one group commit and keep their order.
        """
        task = asyncio.current_task()
        self._connections.add(task)
        peer = _peer_name(writer)
        answers: asyncio.Queue = asyncio.Queue(maxsize=MAX_IN_FLIGHT)
        responder = asyncio.get_running_loop().create_task(self._write_answers(answers, writer, peer))
        try:
            while not responder.done():
                payload = await self._read_frame(reader, peer)
                if payload is None:
                    break
                await answers.put(asyncio.get_running_loop().create_task(self._respond(payload, peer)))
        except ConnectionClosed:
            pass
        except (ConnectionError, asyncio.IncompleteReadError):
            log.debug("connection from %s dropped", peer)
        except asyncio.CancelledError:
            responder.cancel()
        finally:
            await _finish_answers(answers, responder)
            self._connections.discard(task)
            writer.close()

    async def _write_answers(self, answers: asyncio.Queue, writer: asyncio.StreamWriter, peer: str) -> None:
        try:
            while (pending := await answers.get()) is not None:
                response = await pending
                if response:
                    writer.write(response)
                    await writer.drain()
        except ConnectionClosed:
            pass
        except (ConnectionError, asyncio.CancelledError):
            log.debug("connection from %s dropped", peer)
        except Exception:
            log.exception("request from %s failed; closing the connection", peer)
        finally:
            writer.close()
            _cancel_queued(answers)

    async def _read_frame(self, reader: asyncio.StreamReader, peer: str) -> bytes | None:
        try:
            prefix = await reader.readexactly(_SIZE.size)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                log.warning("closing connection from %s: truncated frame size prefix", peer)
            return None
        (size,) = _SIZE.unpack(prefix)
        limit = self.state.config.max_request_bytes
        if not MIN_REQUEST_BYTES <= size <= limit:
            log.warning(
                "closing connection from %s: frame size %d outside [%d, %d] (max_request_bytes)",
                peer,
                size,
                MIN_REQUEST_BYTES,
                limit,
            )
            raise ConnectionClosed
        try:
            return await reader.readexactly(size)
        except asyncio.IncompleteReadError:
            log.warning("closing connection from %s: frame of %d bytes ended early", peer, size)
            return None

    async def _respond(self, payload: bytes, peer: str) -> bytes | None:
        header = peek_header(payload)
        if not is_supported(header.api_key, header.api_version, self.state.profile):
            return self._refuse(header, peer)
        try:
            request = decode_request(payload, header)
        except MalformedRequestError as exc:
            log.warning("closing connection from %s: %s", peer, exc)
            raise ConnectionClosed from exc
        request.client_host = "/" + peer.rsplit(":", 1)[0]  # how Kafka shows a member's host
        body = await HANDLERS[header.api_key](self.state, request)
        if body is None:
            return None
        return encode_response(body, header.correlation_id)

    def _refuse(self, header: RequestHeader, peer: str) -> bytes:
        if header.api_key == API_VERSIONS_KEY:
            return unsupported_api_versions(self.state.profile, header.correlation_id)
        answer = unsupported_version_response(header) if header.api_key in HANDLERS else None
        if answer is None:
            log.warning(
                "closing connection from %s: api_key=%d version=%d is not supported",
                peer,
                header.api_key,
                header.api_version,
            )
            raise ConnectionClosed
        log.info("UNSUPPORTED_VERSION for api_key=%d v%d from %s", header.api_key, header.api_version, peer)
        return answer


async def _finish_answers(answers: asyncio.Queue, responder: asyncio.Task) -> None:
    """Let the responder answer what was already read, then end; never ends cancelled itself.

    (asyncio's stream server logs an error for a connection callback task that ends cancelled.)
    """
    try:
        if not responder.done():
            await answers.put(None)
        await asyncio.gather(responder, return_exceptions=True)
    except asyncio.CancelledError:
        responder.cancel()


def _cancel_queued(answers: asyncio.Queue) -> None:
    while not answers.empty():
        pending = answers.get_nowait()
        if pending is not None:
            pending.cancel()


def _peer_name(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _apply_retention(store) -> None:
    deleted = store.apply_retention(_now_ms())
    if deleted:
        log.info("retention removed %d segment(s)", deleted)

"""A minimal blocking Kafka client on a raw socket, for tests that must control every byte.

Builds requests with kafka-python's protocol classes (the same schemas the broker decodes) and
record batches with its `DefaultRecordBatchBuilder`, so a test can resend an identical batch
(idempotence) or send exactly the frame it wants (garbage, truncation, unsupported versions).
"""

from __future__ import annotations

import socket
import struct

from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.record.default_records import DefaultRecordBatchBuilder


class RawClient:
    def __init__(self, bootstrap: str, timeout_s: float = 10.0):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self._correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, request, response_class=None):
        """Send `request` (built with version=) and decode the response at the same version."""
        self._correlation += 1
        request.with_header(correlation_id=self._correlation, client_id="raw-test")
        self.sock.sendall(request.encode(framed=True, header=True))
        payload = self.read_frame()
        if payload is None:
            raise ConnectionError("broker closed the connection instead of answering")
        cls = response_class or request.header.get_response_class()
        version = 0 if cls is ApiVersionsResponse else request.API_VERSION
        return cls.decode(payload, version=version, header=True)

    def read_frame(self) -> bytes | None:
        """One response payload, or None when the broker closed the connection."""
        prefix = self._read_exactly(4)
        if prefix is None:
            return None
        return self._read_exactly(struct.unpack(">i", prefix)[0])

    def _read_exactly(self, n: int) -> bytes | None:
        chunks, got = [], 0
        while got < n:
            chunk = self.sock.recv(n - got)
            if not chunk:
                return None
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def api_versions_ok(self) -> bool:
        response = self.request(ApiVersionsRequest(version=0), ApiVersionsResponse)
        return response.error_code == 0 and len(response.api_keys) > 0


def record_batch(
    values: list[bytes], producer_id: int = -1, epoch: int = -1, base_sequence: int = -1
) -> bytes:
    """A magic-v2 batch of `values` (no keys), optionally stamped for an idempotent producer."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=base_sequence,
        batch_size=1 << 20,
    )
    for offset, value in enumerate(values):
        builder.append(offset, timestamp=None, key=None, value=value, headers=[])
    return bytes(builder.build())

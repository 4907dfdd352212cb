"""Kafka record batches (magic v2): header layout, parsing, validation of a produced records blob.

Owns the byte layout of the RecordBatch header, its CRC-32C check and the header rewrites a broker
makes (LogAppendTime stamping). Records inside a batch stay opaque bytes, except for timestamp
lookups (`first_record_at`, via kafka-python's own reader). It touches no files.

Layout (big endian), offsets in bytes from the batch start::

    0 baseOffset int64 | 8 batchLength int32 | 12 partitionLeaderEpoch int32 | 16 magic int8
    17 crc uint32 | 21 attributes int16 | 23 lastOffsetDelta int32 | 27 baseTimestamp int64
    35 maxTimestamp int64 | 43 producerId int64 | 51 producerEpoch int16 | 53 baseSequence int32
    57 recordCount int32 | 61 records...

The CRC covers bytes 21..end, so a broker may rewrite baseOffset and partitionLeaderEpoch freely.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from crc32c import crc32c

from infra.broker.errors import CorruptRecordError, InvalidRecordError

log = logging.getLogger(__name__)


HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the bytes not counted in batchLength
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
CRC_START = 21
MAGIC = 2
INT32_MAX = 2**31 - 1
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
COMPRESSION_MASK = 0x07
LOG_APPEND_TIME_FLAG = 0x08
ATTRIBUTES_FIELD = struct.Struct(">h")  # at byte 21
MAX_TIMESTAMP_FIELD = struct.Struct(">q")  # at byte 35
CRC_FIELD = struct.Struct(">I")  # at byte 17


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed 61-byte header of one v2 record batch."""

    base_offset: int
    length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies (header included)."""
        return LOG_OVERHEAD + self.length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record, wrapping past INT32_MAX to 0 as Kafka does."""
        return next_sequence(self.base_sequence, self.last_offset_delta)


def next_sequence(sequence: int, delta: int = 1) -> int:
    """`sequence + delta` with Kafka's wrap-around at INT32_MAX.

    >>> next_sequence(5), next_sequence(2**31 - 1)
    (6, 0)
    """
    if sequence > INT32_MAX - delta:
        return delta - (INT32_MAX - sequence) - 1
    return sequence + delta


def parse_header(data: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Decode the header at `pos` (no validation beyond having 61 bytes)."""
    if len(data) - pos < HEADER_SIZE:
        raise InvalidRecordError(
            f"record batch header at byte {pos}: need {HEADER_SIZE} bytes, got {len(data) - pos}"
        )
    return BatchHeader(*HEADER.unpack_from(data, pos))


def iter_batches(data: bytes | bytearray | memoryview) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Split a Produce `records` blob into validated v2 batches: (header, the batch's bytes).

    Raises InvalidRecordError for magic != 2, a batch length shorter than the header or longer than
    the data left, a negative lastOffsetDelta, trailing bytes; CorruptRecordError for a CRC mismatch.
    """
    view = memoryview(data)
    total = len(view)
    pos = 0
    while pos < total:
        header = parse_header(view, pos)
        _check_header(header, pos, total - pos)
        end = pos + header.size
        batch = view[pos:end]
        if crc32c(batch[CRC_START:]) != header.crc:
            raise CorruptRecordError(
                f"record batch at byte {pos}: crc {header.crc:#010x} does not match its bytes "
                f"(computed {crc32c(batch[CRC_START:]):#010x})"
            )
        yield header, batch
        pos = end


def _check_header(header: BatchHeader, pos: int, available: int) -> None:
    if header.magic != MAGIC:
        raise InvalidRecordError(f"record batch at byte {pos}: magic {header.magic}, only v2 is supported")
    if header.length < MIN_BATCH_LENGTH:
        raise InvalidRecordError(
            f"record batch at byte {pos}: batchLength {header.length} is shorter than a header"
        )
    if header.size > available:
        raise InvalidRecordError(
            f"record batch at byte {pos}: batchLength {header.length} exceeds the {available} bytes left"
        )
    if header.last_offset_delta < 0 or header.record_count < 0:
        raise InvalidRecordError(
            f"record batch at byte {pos}: lastOffsetDelta {header.last_offset_delta} / "
            f"recordCount {header.record_count} must not be negative"
        )


def stamp_log_append_time(buf: bytearray, pos: int, size: int, stamp: int) -> None:
    """Kafka's LogAppendTime for v2: set the timestamp-type bit and maxTimestamp, then re-CRC."""
    attributes = ATTRIBUTES_FIELD.unpack_from(buf, pos + 21)[0] | LOG_APPEND_TIME_FLAG
    ATTRIBUTES_FIELD.pack_into(buf, pos + 21, attributes)
    MAX_TIMESTAMP_FIELD.pack_into(buf, pos + 35, stamp)
    CRC_FIELD.pack_into(buf, pos + 17, crc32c(memoryview(buf)[pos + CRC_START : pos + size]))


def first_record_at(batch: bytes, timestamp_ms: int, base_offset: int, max_ts: int) -> tuple[int, int]:
    """(offset, timestamp) of the first record in `batch` at or after `timestamp_ms`.

    Falls back to (base_offset, max_ts), batch granularity, when the batch cannot be decoded.
    """
    from kafka.record.default_records import DefaultRecordBatch

    try:
        for record in DefaultRecordBatch(batch):
            if record.timestamp >= timestamp_ms:
                return record.offset, record.timestamp
    except Exception as exc:  # e.g. a codec kafka-python lacks: answer with the batch
        log.debug("cannot decode batch at offset %d for a timestamp lookup: %s", base_offset, exc)
    return base_offset, max_ts

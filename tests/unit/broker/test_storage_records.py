"""Record-batch splitting and validation of Produce payloads, on batches kafka-python builds."""

from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from infra.broker.errors import CorruptRecordError, InvalidRecordError
from infra.broker.records import (
    HEADER_SIZE,
    iter_batches,
    next_sequence,
    parse_header,
)
from tests.support.storage_batches import make_batch


def test_splits_a_blob_of_several_batches_and_decodes_headers():
    first = make_batch([b"a", b"b", b"c"], producer=(42, 3, 10), timestamp_ms=1_000)
    second = make_batch([b"d"], timestamp_ms=2_000)
    batches = list(iter_batches(first + second))
    assert [bytes(view) for _, view in batches] == [first, second]
    header = batches[0][0]
    assert (header.magic, header.record_count, header.last_offset_delta) == (2, 3, 2)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 10)
    assert header.last_sequence == 12
    assert header.max_timestamp == 1_000
    assert not header.is_transactional and not header.is_control
    assert batches[1][0].producer_id == -1


def test_transactional_flag_is_visible():
    builder = DefaultRecordBatchBuilder(2, 0, True, 7, 0, 0, 1 << 20)
    builder.append(0, 1, None, b"v", [])
    header, _ = next(iter_batches(bytes(builder.build())))
    assert header.is_transactional


def test_gzip_batch_is_accepted_verbatim():
    batch = make_batch([b"x" * 1000] * 5, compression=DefaultRecordBatchBuilder.CODEC_GZIP)
    ((header, view),) = list(iter_batches(batch))
    assert bytes(view) == batch and header.record_count == 5


def test_corrupt_payload_fails_the_crc():
    batch = bytearray(make_batch([b"hello world"]))
    batch[-3] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="crc"):
        list(iter_batches(bytes(batch)))


def test_base_offset_and_leader_epoch_are_outside_the_crc():
    batch = bytearray(make_batch([b"v"]))
    batch[0:8] = (123).to_bytes(8, "big")
    batch[12:16] = (9).to_bytes(4, "big")
    ((header, _),) = list(iter_batches(bytes(batch)))
    assert (header.base_offset, header.partition_leader_epoch) == (123, 9)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b.__setitem__(16, 1), "magic 1"),
        (lambda b: b.__setitem__(slice(8, 12), (10).to_bytes(4, "big")), "shorter than a header"),
        (lambda b: b.__setitem__(slice(8, 12), (10**6).to_bytes(4, "big")), "exceeds"),
        (lambda b: b.extend(b"\x00" * 20), "need 61 bytes"),
        (lambda b: b.__delitem__(slice(-5, None)), "exceeds"),
    ],
    ids=["magic", "short-length", "oversized-length", "trailing-bytes", "truncated"],
)
def test_invalid_blobs_name_the_problem(mutate, message):
    batch = bytearray(make_batch([b"value"]))
    mutate(batch)
    with pytest.raises(InvalidRecordError, match=message):
        list(iter_batches(bytes(batch)))


def test_parse_header_needs_a_whole_header():
    with pytest.raises(InvalidRecordError, match=str(HEADER_SIZE)):
        parse_header(b"\x00" * 30)


def test_sequence_wraps_at_int32_max():
    assert next_sequence(2**31 - 1) == 0
    assert next_sequence(2**31 - 2, 3) == 1

"""PartitionLog: append/read, segments, index, timestamps, idempotent producers, retention."""

from __future__ import annotations

import os

import pytest

from infra.broker.errors import (
    CorruptRecordError,
    InvalidConfigError,
    InvalidProducerEpochError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
)
from infra.broker.log import PartitionLog
from infra.broker.log_config import LogConfig
from infra.broker.records import iter_batches
from tests.support.storage_batches import base_offsets, make_batch, read_all, values_of

SMALL = LogConfig(segment_bytes=4096, index_interval_bytes=256)


def fill(partition_log, batches: int, records: int = 3, size: int = 100) -> list[tuple[int, bytes]]:
    """Append `batches` batches; returns every (offset, value) expected back."""
    expected = []
    for b in range(batches):
        values = [b"b%d-r%d-" % (b, r) + b"x" * size for r in range(records)]
        result = partition_log.append(make_batch(values))
        expected.extend(zip(range(result.base_offset, result.last_offset + 1), values, strict=True))
    return expected


def test_round_trip_across_segment_rolls(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", SMALL)
    expected = fill(plog, 60)
    assert plog.segment_count > 5, "small segment.bytes must roll segments"
    assert [o for o, _ in expected] == list(range(180))
    assert plog.high_watermark == 180 and plog.log_start_offset == 0
    assert read_all(plog) == expected
    files = sorted(p.name for p in (tmp_path / "t-0").glob("*.log"))
    assert files[0] == f"{0:020d}.log" and len(files) == plog.segment_count


def test_stored_bytes_are_verbatim_except_offset_and_leader_epoch(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", LogConfig())
    plog.append(make_batch([b"first"]))
    batch = bytearray(make_batch([b"a", b"b"]))
    batch[12:16] = (77).to_bytes(4, "big")  # a client's leader epoch is replaced by 0
    plog.append(bytes(batch))
    stored = plog.read(1, 1 << 20)
    assert stored[16:] == bytes(batch[16:])
    assert int.from_bytes(stored[0:8], "big") == 1
    assert stored[12:16] == b"\x00\x00\x00\x00"


def test_read_returns_whole_batch_containing_offset_and_respects_max_bytes(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", LogConfig())
    fill(plog, 10, records=4)  # batches at 0, 4, 8, ...
    batch_size = len(plog.read(0, 1))
    assert base_offsets(plog.read(0, 1)) == [0], "max_bytes below one batch still returns one batch"
    assert base_offsets(plog.read(6, 1)) == [4], "the batch containing offset 6 starts at 4"
    assert base_offsets(plog.read(6, int(batch_size * 2.5))) == [4, 8]
    assert base_offsets(plog.read(37, 1 << 20)) == [36]
    assert plog.read(40, 1 << 20) == b"", "reading at the high watermark returns nothing"


def test_sequential_reads_follow_the_log(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", SMALL)
    expected = fill(plog, 40)
    got, offset = [], 0
    while offset < plog.high_watermark:  # like a consumer: next fetch at last offset + 1
        chunk = values_of(plog.read(offset, 700))
        got.extend(chunk)
        offset = chunk[-1][0] + 1
    assert got == expected
    expected += fill(plog, 2)
    assert values_of(plog.read(offset, 1 << 20)) == expected[offset:]


def test_reads_outside_the_log_are_out_of_range(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", LogConfig())
    fill(plog, 2)
    with pytest.raises(OffsetOutOfRangeError, match="offset: 7"):
        plog.read(7, 100)
    with pytest.raises(OffsetOutOfRangeError):
        plog.read(-1, 100)


def test_invalid_or_corrupt_appends_write_nothing(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", LogConfig())
    good = make_batch([b"ok"])
    corrupt = bytearray(make_batch([b"payload"]))
    corrupt[-2] ^= 1
    with pytest.raises(CorruptRecordError):
        plog.append(good + bytes(corrupt))
    with pytest.raises(InvalidRecordError, match="empty"):
        plog.append(b"")
    with pytest.raises(InvalidRecordError):
        plog.append(b"garbage" * 20)
    assert plog.high_watermark == 0 and plog.read(0, 100) == b""
    assert plog.append(good).base_offset == 0


def test_several_batches_in_one_append_get_consecutive_offsets(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", LogConfig())
    result = plog.append(make_batch([b"a", b"b"]) + make_batch([b"c"]) + make_batch([b"d", b"e"]))
    assert (result.base_offset, result.last_offset, result.duplicate) == (0, 4, False)
    assert read_all(plog) == list(enumerate([b"a", b"b", b"c", b"d", b"e"]))


def test_offset_for_timestamp_finds_first_record_at_or_after(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", SMALL)
    for i in range(30):
        plog.append(make_batch([b"v" * 200, b"w" * 200], timestamp_ms=1_000 * (i + 1)))
    assert plog.offset_for_timestamp(0) == (0, 1_000)
    assert plog.offset_for_timestamp(15_000) == (28, 15_000)
    assert plog.offset_for_timestamp(15_001) == (30, 16_000)
    assert plog.offset_for_timestamp(30_001) is None


# --- idempotent producer -------------------------------------------------------------------------


def test_retried_batch_is_acknowledged_without_duplication(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", LogConfig())
    first = plog.append(make_batch([b"a", b"b"], producer=(5, 0, 0)))
    second = plog.append(make_batch([b"c"], producer=(5, 0, 2)))
    retry = plog.append(make_batch([b"a", b"b"], producer=(5, 0, 0)))
    assert retry.duplicate and (retry.base_offset, retry.last_offset) == (
        first.base_offset,
        first.last_offset,
    )
    assert plog.append(make_batch([b"c"], producer=(5, 0, 2))).base_offset == second.base_offset
    assert plog.high_watermark == 3
    assert [v for _, v in read_all(plog)] == [b"a", b"b", b"c"]


def test_out_of_order_sequence_is_rejected(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", LogConfig())
    plog.append(make_batch([b"a"], producer=(5, 0, 0)))
    with pytest.raises(OutOfOrderSequenceError, match=r"base_sequence: 3 .* expected 1"):
        plog.append(make_batch([b"gap"], producer=(5, 0, 3)))
    assert plog.high_watermark == 1
    plog.append(make_batch([b"b"], producer=(5, 0, 1)))
    assert plog.high_watermark == 2


def test_producer_epochs(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", LogConfig())
    plog.append(make_batch([b"a"], producer=(5, 2, 0)))
    with pytest.raises(InvalidProducerEpochError, match="producer_epoch: 1"):
        plog.append(make_batch([b"old"], producer=(5, 1, 1)))
    with pytest.raises(OutOfOrderSequenceError, match="new epoch 3"):
        plog.append(make_batch([b"new"], producer=(5, 3, 4)))
    assert plog.append(make_batch([b"new"], producer=(5, 3, 0))).base_offset == 1
    other = plog.append(make_batch([b"x"], producer=(6, 0, 17)))  # unknown producer: any sequence
    assert not other.duplicate and plog.high_watermark == 3


def test_only_the_last_five_batches_are_deduplicated(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", LogConfig())
    for seq in range(7):
        plog.append(make_batch([b"v%d" % seq], producer=(9, 0, seq)))
    assert plog.append(make_batch([b"v2"], producer=(9, 0, 2))).duplicate
    with pytest.raises(OutOfOrderSequenceError):
        plog.append(make_batch([b"v1"], producer=(9, 0, 1)))


@pytest.mark.parametrize("clean", [True, False], ids=["clean-close", "crash"])
def test_dedup_survives_reopen(tmp_path, clean):
    from tests.support.storage_batches import crash

    plog = PartitionLog(tmp_path / "t-0", SMALL)
    fill(plog, 20)  # several segments, so the state spans a roll snapshot and the recovered tail
    acked = [plog.append(make_batch([b"p%d" % s, b"q"], producer=(11, 0, 2 * s))) for s in range(3)]
    plog.close() if clean else crash(plog)
    reopened = PartitionLog(tmp_path / "t-0", SMALL)
    retry = reopened.append(make_batch([b"p2", b"q"], producer=(11, 0, 4)))
    assert retry.duplicate and retry.base_offset == acked[2].base_offset
    with pytest.raises(OutOfOrderSequenceError):
        reopened.append(make_batch([b"skip"], producer=(11, 0, 9)))
    assert reopened.append(make_batch([b"next"], producer=(11, 0, 6))).base_offset == acked[2].last_offset + 1


# --- retention -------------------------------------------------------------------------------------


def test_retention_by_time_deletes_whole_old_segments(tmp_path):
    config = LogConfig(segment_bytes=2048, retention_ms=60_000)
    plog = PartitionLog(tmp_path / "t-0", config)
    for i in range(40):
        old = i < 20
        plog.append(make_batch([b"x" * 300], timestamp_ms=1_000_000 if old else 2_000_000))
    segments_before = plog.segment_count
    deleted = plog.apply_retention(now_ms=2_000_000)
    assert deleted > 0 and plog.segment_count == segments_before - deleted
    start = plog.log_start_offset
    assert 0 < start <= 20, "only segments whose newest record is older than retention.ms go"
    with pytest.raises(OffsetOutOfRangeError):
        plog.read(0, 100)
    assert [o for o, _ in read_all(plog)] == list(range(start, 40))
    assert not (tmp_path / "t-0" / f"{0:020d}.log").exists()
    assert plog.apply_retention(now_ms=2_000_000) == 0


def test_retention_never_deletes_the_active_segment(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", LogConfig(segment_bytes=2048, retention_ms=0))
    fill(plog, 30)
    plog.apply_retention(now_ms=10**13)
    assert plog.segment_count == 1 and plog.log_start_offset > 0
    assert plog.high_watermark == 90 and read_all(plog)[-1][0] == 89


def test_retention_by_size_and_log_start_survives_reopen(tmp_path):
    config = LogConfig(segment_bytes=2048, retention_ms=-1, retention_bytes=5000)
    plog = PartitionLog(tmp_path / "t-0", config)
    fill(plog, 40)
    total = plog.size_bytes
    assert plog.apply_retention(now_ms=0) > 0
    assert plog.size_bytes <= 5000 + 2048 and plog.size_bytes < total
    start = plog.log_start_offset
    plog.close()
    reopened = PartitionLog(tmp_path / "t-0", config)
    assert reopened.log_start_offset == start and reopened.high_watermark == 120


# --- configuration ---------------------------------------------------------------------------------


def test_log_config_from_kafka_topic_config():
    base = LogConfig(flush="interval", flush_interval_ms=500)
    cfg = LogConfig.from_topic_config(
        {"segment.bytes": "1024", "retention.ms": "-1", "retention.bytes": "10", "cleanup.policy": "delete"},
        base=base,
    )
    assert (cfg.segment_bytes, cfg.retention_ms, cfg.retention_bytes) == (1024, -1, 10)
    assert (cfg.flush, cfg.flush_interval_ms) == ("interval", 500)
    assert LogConfig.from_topic_config({"flush.messages": "1"}, base=base).flush == "always"
    assert LogConfig.from_topic_config({"flush.ms": "200"}).flush_interval_ms == 200
    assert LogConfig.from_topic_config({"flush.ms": "200"}).flush == "interval"
    compacted = LogConfig.from_topic_config({"cleanup.policy": "compact", "retention.ms": "1000"})
    assert (compacted.retention_ms, compacted.retention_bytes) == (-1, -1), "no compaction: keep all"
    windowed = LogConfig.from_topic_config({"cleanup.policy": "compact,delete", "retention.ms": "1000"})
    assert windowed.retention_ms == 1000
    with pytest.raises(InvalidConfigError, match=r"cleanup\.policy"):
        LogConfig.from_topic_config({"cleanup.policy": "shred"})
    with pytest.raises(InvalidConfigError, match=r"retention\.ms: must be an integer"):
        LogConfig.from_topic_config({"retention.ms": "soon"})


def test_interval_flush_log_is_readable_immediately(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", LogConfig(flush="interval", flush_interval_ms=60_000))
    expected = fill(plog, 5)
    assert read_all(plog) == expected
    plog.flush()
    plog.close()
    assert read_all(PartitionLog(tmp_path / "t-0", LogConfig())) == expected


def test_delete_removes_the_partition_directory(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", SMALL)
    fill(plog, 20)
    plog.delete()
    assert not (tmp_path / "t-0").exists()


def test_headers_of_read_data_are_valid_batches(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", SMALL)
    fill(plog, 20)
    data = plog.read(0, 1 << 20)
    assert [h.base_offset for h, _ in iter_batches(data)] == list(range(0, 3 * len(base_offsets(data)), 3))


def test_silent_producers_are_forgotten_and_then_accepted_as_new():
    from infra.broker.producer_state import PRODUCER_EXPIRATION_MS, ProducerEntry, expire_producers

    producers = {1: ProducerEntry(0, [(0, 0, 0, 0)], last_timestamp=1_000), 2: ProducerEntry(0, [], 10**13)}
    assert expire_producers(producers, now_ms=1_000 + PRODUCER_EXPIRATION_MS + 1) == 1
    assert list(producers) == [2]


def test_deferred_sync_with_concurrent_flushes_and_appends(tmp_path):
    import threading

    plog = PartitionLog(tmp_path / "t-0", LogConfig(segment_bytes=8192))
    stop = threading.Event()

    def flusher():
        while not stop.is_set():
            plog.flush()

    def producer(tag: bytes):
        for i in range(150):
            plog.append(make_batch([tag + b"%d" % i]), sync=False)

    threads = [
        threading.Thread(target=flusher),
        *(threading.Thread(target=producer, args=(t,)) for t in (b"a", b"b")),
    ]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    stop.set()
    threads[0].join()
    plog.flush()
    values = [v for _, v in read_all(plog)]
    assert sorted(values) == sorted([b"a%d" % i for i in range(150)] + [b"b%d" % i for i in range(150)])
    assert [v for v in values if v.startswith(b"a")] == [b"a%d" % i for i in range(150)], "per-producer order"
    plog.close()
    assert [v for _, v in read_all(PartitionLog(tmp_path / "t-0", LogConfig()))] == values


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to count descriptors")
def test_many_segments_do_not_hold_a_descriptor_each(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", LogConfig(segment_bytes=600))
    expected = fill(plog, 80)
    assert plog.segment_count >= 60
    plog.close()
    before = len(os.listdir("/proc/self/fd"))
    reopened = PartitionLog(tmp_path / "t-0", LogConfig(segment_bytes=600))
    assert read_all(reopened, max_bytes=1) == expected  # touches every segment
    assert len(os.listdir("/proc/self/fd")) - before <= 10


def test_log_append_time_topics_are_stamped_by_the_broker(tmp_path):
    import time

    from kafka.record.default_records import DefaultRecordBatch

    config = LogConfig.from_topic_config({"message.timestamp.type": "LogAppendTime"})
    plog = PartitionLog(tmp_path / "t-0", config)
    before = int(time.time() * 1000)
    result = plog.append(make_batch([b"a", b"b"], timestamp_ms=1_000))
    assert result.log_append_time_ms >= before
    data = plog.read(0, 1 << 20)
    ((header, _),) = list(iter_batches(data))  # the CRC still verifies after the rewrite
    assert header.max_timestamp == result.log_append_time_ms
    batch = DefaultRecordBatch(data)
    assert batch.timestamp_type == 1 and [r.timestamp for r in batch] == [result.log_append_time_ms] * 2
    assert plog.offset_for_timestamp(before) == (0, result.log_append_time_ms)
    assert PartitionLog(tmp_path / "u-0", LogConfig()).append(make_batch([b"c"])).log_append_time_ms == -1
    with pytest.raises(InvalidConfigError, match=r"message\.timestamp\.type"):
        LogConfig.from_topic_config({"message.timestamp.type": "Whenever"})


def test_batches_above_max_message_bytes_are_refused(tmp_path):
    from infra.broker.errors import RecordTooLargeError

    plog = PartitionLog(tmp_path / "t-0", LogConfig.from_topic_config({"max.message.bytes": "2000"}))
    with pytest.raises(RecordTooLargeError, match=r"exceeds max\.message\.bytes 2000"):
        plog.append(make_batch([b"x" * 1000, b"y" * 1000]))
    assert plog.high_watermark == 0
    assert plog.append(make_batch([b"x" * 1000])).base_offset == 0

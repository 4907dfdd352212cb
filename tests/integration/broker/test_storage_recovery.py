"""Recovery of a PartitionLog after crashes: torn tails, corrupt CRCs, kill -9, lost index files."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.broker.log import PartitionLog
from infra.broker.log_config import LogConfig
from tests.support.processes import wait_for
from tests.support.storage_batches import crash, make_batch, read_all

SMALL = LogConfig(segment_bytes=4096, index_interval_bytes=256)


def fill(plog, batches: int, records: int = 2, size: int = 150) -> list[tuple[int, bytes]]:
    expected = []
    for b in range(batches):
        values = [b"%d-%d-" % (b, r) + b"z" * size for r in range(records)]
        result = plog.append(make_batch(values))
        expected.extend(zip(range(result.base_offset, result.last_offset + 1), values, strict=True))
    return expected


def last_segment(directory: Path) -> Path:
    return sorted(directory.glob("*.log"))[-1]


def test_torn_tail_keeps_every_complete_batch(tmp_path, caplog):
    plog = PartitionLog(tmp_path / "t-0", SMALL)
    expected = fill(plog, 30)
    crash(plog)
    segment = last_segment(tmp_path / "t-0")
    size = segment.stat().st_size
    with open(segment, "ab") as fh:  # half of a further batch reached the disk
        fh.write(make_batch([b"torn" * 50])[:90])
    with caplog.at_level(logging.WARNING, logger="infra.broker.log"):
        recovered = PartitionLog(tmp_path / "t-0", SMALL)
    assert read_all(recovered) == expected
    assert recovered.high_watermark == 60
    assert segment.stat().st_size == size
    assert any(segment.name in r.getMessage() and f"at byte {size}" in r.getMessage() for r in caplog.records)
    assert recovered.append(make_batch([b"after"])).base_offset == 60


def test_truncation_mid_batch_drops_only_that_batch(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", SMALL)
    expected = fill(plog, 30)
    crash(plog)
    segment = last_segment(tmp_path / "t-0")
    os.truncate(segment, segment.stat().st_size - 7)  # the last acknowledged batch was torn
    recovered = PartitionLog(tmp_path / "t-0", SMALL)
    assert read_all(recovered) == expected[:-2]
    assert recovered.high_watermark == 58


def test_corrupt_crc_in_last_batch_drops_it(tmp_path, caplog):
    plog = PartitionLog(tmp_path / "t-0", SMALL)
    expected = fill(plog, 30)
    crash(plog)
    segment = last_segment(tmp_path / "t-0")
    data = bytearray(segment.read_bytes())
    data[-10] ^= 0x55
    segment.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="infra.broker.log"):
        recovered = PartitionLog(tmp_path / "t-0", SMALL)
    assert read_all(recovered) == expected[:-2]
    assert any("crc mismatch" in r.getMessage() for r in caplog.records)
    reopened_again = (recovered.close(), PartitionLog(tmp_path / "t-0", SMALL))[1]
    assert read_all(reopened_again) == expected[:-2]


def test_clean_shutdown_marker_is_consumed_and_garbage_after_it_is_still_caught(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", SMALL)
    expected = fill(plog, 30)
    plog.close()
    assert (tmp_path / "t-0" / ".clean_shutdown").exists()
    reopened = PartitionLog(tmp_path / "t-0", SMALL)
    assert not (tmp_path / "t-0" / ".clean_shutdown").exists(), "a later crash must trigger a full scan"
    assert read_all(reopened) == expected
    reopened.close()
    with open(last_segment(tmp_path / "t-0"), "ab") as fh:
        fh.write(b"\x00" * 40)
    assert read_all(PartitionLog(tmp_path / "t-0", SMALL)) == expected


def test_lost_index_files_are_rebuilt(tmp_path):
    plog = PartitionLog(tmp_path / "t-0", SMALL)
    expected = fill(plog, 40)
    plog.close()
    for index in (tmp_path / "t-0").glob("*.index"):
        index.unlink()
    reopened = PartitionLog(tmp_path / "t-0", SMALL)
    assert read_all(reopened) == expected
    assert reopened.read(41, 1)[:8] == (40).to_bytes(8, "big")


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from infra.broker.log import PartitionLog
    from infra.broker.log_config import LogConfig
    from tests.support.storage_batches import make_batch
    plog = PartitionLog(Path(sys.argv[1]), LogConfig(segment_bytes=64 * 1024))
    i = 0
    while True:
        result = plog.append(make_batch([b"m%d" % i, b"n%d" % i], producer=(3, 0, 2 * i)))
        print(result.base_offset, flush=True)  # acknowledged: printed only after fsync
        i += 1
    """
)


def test_kill9_during_appends_loses_no_acknowledged_batch(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    out_path = tmp_path / "acks.txt"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path / "t-0")], stdout=out, env=env, start_new_session=True
        )
        try:
            wait_for(
                lambda: out_path.read_bytes().count(b"\n") >= 300, timeout_s=60, what="300 acked appends"
            )
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    acked = [int(line) for line in out_path.read_bytes().split(b"\n")[:-1]]
    recovered = PartitionLog(tmp_path / "t-0", LogConfig(segment_bytes=64 * 1024))
    records = read_all(recovered)
    assert [o for o, _ in records] == list(range(len(records))), "offsets stay contiguous"
    assert len(records) >= 2 * len(acked) and max(acked) < recovered.high_watermark
    assert [v for _, v in records[: 2 * len(acked)]] == [
        b"%s%d" % (p, i) for i in range(len(acked)) for p in (b"m", b"n")
    ]
    n = len(records) // 2 - 1  # the producer retries its last batch after the restart: deduplicated
    retry = recovered.append(make_batch([b"m%d" % n, b"n%d" % n], producer=(3, 0, 2 * n)))
    assert retry.duplicate and retry.base_offset == 2 * n


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    appends=st.lists(
        st.lists(st.binary(min_size=0, max_size=400), min_size=1, max_size=6), min_size=1, max_size=40
    ),
    segment_bytes=st.sampled_from([300, 1024, 4096, 1 << 20]),
    clean=st.booleans(),
)
def test_reads_are_identical_after_reopen(tmp_path_factory, appends, segment_bytes, clean):
    directory = tmp_path_factory.mktemp("prop") / "t-0"
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=200)
    plog = PartitionLog(directory, config)
    for values in appends:
        plog.append(make_batch(values))
    before = [plog.read(o, m) for o in range(plog.high_watermark) for m in (1, 700)]
    everything = read_all(plog)
    plog.close() if clean else crash(plog)
    reopened = PartitionLog(directory, config)
    assert reopened.high_watermark == sum(len(v) for v in appends)
    assert read_all(reopened) == everything
    assert [reopened.read(o, m) for o in range(reopened.high_watermark) for m in (1, 700)] == before


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 4), st.booleans()),  # producer, records, retry it
        min_size=1,
        max_size=40,
    ),
    segment_bytes=st.sampled_from([400, 2048, 1 << 20]),
    clean=st.booleans(),
)
def test_idempotent_appends_match_a_model_across_reopen(tmp_path_factory, steps, segment_bytes, clean):
    directory = tmp_path_factory.mktemp("idem") / "t-0"
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=150)
    plog = PartitionLog(directory, config)
    next_seq = [0, 0, 0]
    model: list[bytes] = []
    sent: list[tuple[bytes, int]] = []  # (batch, first offset) of every batch actually appended
    for producer, count, retry in steps:
        values = [b"p%d-s%d-%d" % (producer, next_seq[producer], i) for i in range(count)]
        batch = make_batch(values, producer=(100 + producer, 0, next_seq[producer]))
        result = plog.append(batch)
        assert not result.duplicate and result.base_offset == len(model)
        sent.append((batch, result.base_offset))
        model.extend(values)
        next_seq[producer] += count
        if retry:
            again = plog.append(batch)
            assert again.duplicate and again.base_offset == result.base_offset
    plog.close() if clean else crash(plog)
    reopened = PartitionLog(directory, config)
    assert [v for _, v in read_all(reopened)] == model
    last_batch, last_offset = sent[-1]
    again = reopened.append(last_batch)
    assert again.duplicate and again.base_offset == last_offset
    assert reopened.high_watermark == len(model)


DISK_FULL = textwrap.dedent(
    """
    import resource, signal, sys
    from pathlib import Path
    from infra.broker.errors import StorageIOError
    from infra.broker.log import PartitionLog
    from infra.broker.log_config import LogConfig
    from tests.support.storage_batches import make_batch
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    plog = PartitionLog(Path(sys.argv[1]), LogConfig())
    resource.setrlimit(resource.RLIMIT_FSIZE, (5000, 5000))
    acked = 0
    try:
        while True:
            plog.append(make_batch([b"x" * 300]))
            acked += 1
    except StorageIOError as exc:
        print(acked, plog.high_watermark, plog.size_bytes, exc)
    """
)


def test_disk_full_append_fails_cleanly_and_leaves_no_partial_batch(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run(
        [sys.executable, "-c", DISK_FULL, str(tmp_path / "t-0")], env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()
    acked, hw, size, *message = done.stdout.decode().split()
    assert int(acked) == int(hw) > 0 and "failed" in " ".join(message)
    segment = last_segment(tmp_path / "t-0")
    assert segment.stat().st_size == int(size), "the failed append left no bytes behind"
    recovered = PartitionLog(tmp_path / "t-0", LogConfig())
    assert [v for _, v in read_all(recovered)] == [b"x" * 300] * int(acked)


def test_recovery_benchmark_helper_reports_a_correct_recovery(tmp_path):
    from infra.bench.broker_recovery import measure_recovery

    figures = measure_recovery(tmp_path, 3_000_000, segment_bytes=1_000_000)
    assert figures["correct"] is True
    assert figures["segments"] >= 3 and figures["total_bytes"] >= 3_000_000
    # since #34 every segment is verified at load (corruption in a sealed segment is found too)
    assert figures["scanned_bytes"] == figures["total_bytes"], "every segment is verified"

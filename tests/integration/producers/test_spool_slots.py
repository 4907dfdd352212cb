"""Spool slots claimed by several real processes at once under one spool root (what several
`agentstream rollout` processes sharing a data directory do): every process gets a slot, no slot has
two writers, and every record a process appended is still in the spool afterwards."""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
from pathlib import Path

import pytest

from producers.sdk.spool import Spool, SpoolRecord, decode_body, scan_frames

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WRITERS = 8
RECORDS = 5
JOIN_S = 60


def _claim_and_write(root: str, writer: str, start, holding, results) -> None:
    """In a child process: open a slot when every writer is ready, append this writer's records,
    hold the slot until every writer has one (so no slot is freed and reused in between)."""
    try:
        start.wait(JOIN_S)
        spool = Spool.open_slot(Path(root), fsync=False)
        spool.append(
            SpoolRecord("agent.events", writer.encode(), f"{writer}-{i}", b"v") for i in range(RECORDS)
        )
        results.put((writer, spool.directory.name))
        with contextlib.suppress(threading.BrokenBarrierError):  # another writer failed: reported there
            holding.wait(JOIN_S)
        spool.close()
    except Exception as exc:  # reported to the test, which names the writer and the error
        holding.abort()  # the others stop waiting for this writer
        results.put((writer, f"error: {exc!r}"))


def _claim_all_at_once(root: Path, writers: list[str]) -> dict[str, str]:
    """Start one process per writer, all opening a slot at the same moment; writer -> slot name."""
    ctx = multiprocessing.get_context("fork")
    start, holding, results = ctx.Barrier(len(writers)), ctx.Barrier(len(writers)), ctx.Queue()
    procs = [
        ctx.Process(target=_claim_and_write, args=(str(root), w, start, holding, results)) for w in writers
    ]
    for proc in procs:
        proc.start()
    try:
        claimed = dict(results.get(timeout=JOIN_S) for _ in writers)
    finally:
        for proc in procs:
            proc.join(JOIN_S)
            if proc.is_alive():
                proc.kill()
    assert all(proc.exitcode == 0 for proc in procs), [proc.exitcode for proc in procs]
    return claimed


def _writers_by_slot(root: Path) -> dict[str, list[str]]:
    """Slot name -> the writers of its records, in spool order (read from the segment files)."""
    out: dict[str, list[str]] = {}
    for slot in sorted(p for p in root.iterdir() if p.is_dir()):
        keys = []
        for segment in sorted(slot.glob("*.seg")):
            keys += [
                decode_body(body).key.decode() for _, _, body in scan_frames(segment.read_bytes()) if body
            ]
        out[slot.name] = [keys[i] for i in range(0, len(keys), RECORDS)]  # one run of RECORDS per writer
        assert keys == [k for k in out[slot.name] for _ in range(RECORDS)], f"slot {slot.name}: {keys}"
    return out


def test_processes_opening_slots_at_once_each_get_their_own_and_keep_their_records(tmp_path):
    root = tmp_path / "spool"
    first = [f"a{i}" for i in range(WRITERS)]
    claimed = _claim_all_at_once(root, first)
    assert not [v for v in claimed.values() if v.startswith("error")], claimed
    assert len(set(claimed.values())) == WRITERS, f"a slot was handed to two writers: {claimed}"
    assert _writers_by_slot(root) == {slot: [writer] for writer, slot in claimed.items()}

    # every slot still holds undelivered records: more processes than slots now, again at once; each
    # old slot is taken by one process (after its records) and the rest open new ones
    second = [f"b{i}" for i in range(WRITERS + 3)]
    again = _claim_all_at_once(root, second)
    assert not [v for v in again.values() if v.startswith("error")], again
    assert len(set(again.values())) == len(second), f"a slot was handed to two writers: {again}"
    assert set(claimed.values()) <= set(again.values()), "a slot with undelivered records was passed over"
    expected = {slot: [writer] for writer, slot in claimed.items()}
    for writer, slot in again.items():
        expected[slot] = [*expected.get(slot, []), writer]
    assert _writers_by_slot(root) == expected

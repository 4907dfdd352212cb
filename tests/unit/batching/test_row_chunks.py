"""A batch's rows as `batch.rows` chunks (pure): the canonical checksum, the chunk bounds, ids that
repeat on a re-publish, and a row too large for one event refused before anything is written."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from consumers.batching.batch_writer import BatchStore, read_rows
from consumers.batching.row_chunks import CHUNK_BYTES, canonical_lines, chunk_events, chunk_rows, rows_sha256
from consumers.errors import TrainerError
from schemas.codec import decode, encode
from schemas.events import BatchRows, utc_now
from schemas.limits import MAX_EVENT_BYTES


def _meta(ids):
    return {
        "trajectory_ids": ids,
        "content_hashes": [],
        "source_offsets": {},
        "reward_versions": [],
        "calibration_versions": [],
        "policy_versions": [],
        "builder_config": {},
    }


def _rows(n, width=3000):
    return [
        {"trajectory_id": f"t{i}", "input_ids": list(range(i, i + width)), "advantage": i / 7}
        for i in range(n)
    ]


def test_the_rows_checksum_is_the_jsonl_files_and_the_chunks_carry_every_row_in_order(tmp_path):
    rows = _rows(300)  # ~4.6 MB of JSON: many chunks
    manifest = BatchStore(tmp_path).write("grpo", rows, _meta([r["trajectory_id"] for r in rows]))
    assert manifest.rows_sha256 == manifest.sha256
    assert manifest.sha256 == hashlib.sha256(Path(manifest.path).read_bytes()).hexdigest()
    *chunks, built = manifest.events()
    assert (built.chunks, built.rows_sha256) == (len(chunks), manifest.sha256) and len(chunks) > 10
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert [r for c in chunks for r in c.rows] == rows
    for chunk in chunks:
        encoded = encode(chunk)
        assert len(encoded) <= MAX_EVENT_BYTES
        assert sum(map(len, canonical_lines(chunk.rows))) <= CHUNK_BYTES or len(chunk.rows) == 1
        assert decode(encoded) == chunk  # the rows survive the codec unchanged
    # a re-publish (after a crash) gives the same events, ids included: the executor drops duplicates
    assert [e.event_id for e in manifest.events()] == [e.event_id for e in [*chunks, built]]


def test_a_row_larger_than_a_chunk_travels_alone():
    rows = [{"x": "a" * 100}, {"x": "b" * 5000}, {"x": "c" * 100}]
    assert [len(c) for c in chunk_rows(rows, "b1", chunk_bytes=1000)] == [1, 1, 1]
    assert [len(c) for c in chunk_rows(rows[:1] * 4, "b1", chunk_bytes=1000)] == [4]


def test_a_row_no_event_can_carry_is_refused_before_the_batch_is_written(tmp_path):
    rows = [{"x": 1}, {"x": "y" * (MAX_EVENT_BYTES + 10)}]
    with pytest.raises(TrainerError, match=r"batch grpo-\w+: row 1 takes \d+ bytes as JSON, over the"):
        BatchStore(tmp_path).write("grpo", rows, _meta(["t1", "t2"]))
    assert not list((tmp_path / "batches" / "grpo").iterdir()), "nothing written for a batch never published"


def test_parquet_batches_carry_the_rows_as_the_file_gives_them_back(tmp_path):
    rows = [{"a": 1, "b": "x"}, {"a": 2}]  # Parquet gives every row every key
    manifest = BatchStore(tmp_path).write("sft", rows, _meta(["t1", "t2"]), fmt="parquet")
    back = read_rows(manifest.path)
    assert back == [{"a": 1, "b": "x"}, {"a": 2, "b": None}]
    assert manifest.rows_sha256 == rows_sha256(back) != manifest.sha256
    *chunks, _built = manifest.events()
    assert [r for c in chunks for r in c.rows] == back


def test_a_file_changed_since_its_manifest_is_not_published(tmp_path):
    manifest = BatchStore(tmp_path).write("sft", [{"a": 1}], _meta(["t1"]))
    Path(manifest.path).write_bytes(b'{"a": 2}\n')
    with pytest.raises(TrainerError, match="no longer match the manifest"):
        manifest.events()


def test_chunk_ids_depend_on_the_batch_its_rows_and_the_index():
    now = utc_now()
    one = chunk_events("b1", "sft", [{"a": 1}], now, "trainer")
    assert [e.event_id for e in one] == [
        e.event_id for e in chunk_events("b1", "sft", [{"a": 1}], now, "trainer")
    ]
    assert one[0].event_id != chunk_events("b1", "sft", [{"a": 2}], now, "trainer")[0].event_id
    assert one[0].event_id != chunk_events("b2", "sft", [{"a": 1}], now, "trainer")[0].event_id
    assert isinstance(one[0], BatchRows) and one[0].trajectory_id == "b1"  # the key: the batch's partition

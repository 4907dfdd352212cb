"""Batch store crash recovery (pure file-system tests; the kill -9 stream test is
tests/integration/batching/test_stream.py)."""

from __future__ import annotations

from consumers.batching.batch_writer import BatchStore, batch_id_for, read_rows
from consumers.batching.consumer import known_state


def _meta(ids):
    return {
        "trajectory_ids": ids,
        "content_hashes": [f"h-{i}" for i in ids],
        "source_offsets": {"trajectory.scored": {"0": 3}},
        "reward_versions": ["rules-1"],
        "calibration_versions": [],
        "policy_versions": ["v0"],
        "builder_config": {"min_margin": 0.05},
    }


def test_write_is_idempotent_and_the_event_id_deterministic(tmp_path):
    store = BatchStore(tmp_path)
    first = store.write("sft", [{"a": 1}, {"a": 2}], _meta(["t1", "t2"]))
    again = store.write("sft", [{"a": 1}, {"a": 2}], _meta(["t2", "t1"]))
    assert first.batch_id == again.batch_id == batch_id_for("sft", ["t1", "t2"])
    assert first.event().event_id == again.event().event_id
    assert read_rows(first.path) == [{"a": 1}, {"a": 2}]
    assert first.event().source_offsets == {"trajectory.scored": {"0": 3}}


def test_recovery_after_crashes_at_each_point(tmp_path):
    store = BatchStore(tmp_path)
    published = store.write("sft", [{"a": 1}], _meta(["t1"]))
    store.mark_published(published)
    unpublished = store.write("grpo", [{"b": 1}], _meta(["t2"]))  # crashed before the event was acked
    kind_dir = store.kind_dir("dpo")
    (kind_dir / "dpo-x.jsonl.tmp").write_text("half")  # crashed while writing the data file
    (kind_dir / "dpo-y.jsonl").write_text("{}\n")  # crashed before the manifest (the commit point)
    (kind_dir / "dpo-z.manifest.json.tmp").write_text("{")  # crashed while writing the manifest

    recovered = BatchStore(tmp_path).recover()
    assert sorted(p.name for p in kind_dir.iterdir()) == []
    assert [m.batch_id for m in recovered.unpublished] == [unpublished.batch_id]
    assert recovered.trajectory_ids["sft"] == {"t1"} and recovered.trajectory_ids["grpo"] == {"t2"}
    _, hashes = known_state(recovered)
    assert hashes["grpo"] == {"h-t2": "t2"}


def test_parquet_batches(tmp_path):
    store = BatchStore(tmp_path)
    manifest = store.write(
        "sft", [{"messages": [{"role": "user", "content": "x"}]}], _meta(["t1"]), fmt="parquet"
    )
    assert manifest.path.endswith(".parquet") and manifest.format == "parquet"
    assert read_rows(manifest.path) == [{"messages": [{"role": "user", "content": "x"}]}]

"""The dataset card and the rows: what a person reads in README.md (counts, kind, reward definition
and versions, policy versions, source offsets, batch ids, how it was made), a YAML header whose
`configs` make `datasets.load_dataset(DIR)` find every split, and rows made by the trainer's builders."""

from __future__ import annotations

import json

import pytest
import yaml

from consumers.batching.batch_writer import BatchStore
from consumers.batching.builders.dpo import StepPairBuilder
from consumers.batching.builders.grpo import GRPOGroupBuilder, GRPOGroupConfig
from consumers.batching.builders.sft import SFTBuilder, SFTBuilderConfig
from infra.export.card import render_card
from infra.export.config import ExportConfig
from infra.export.rows import build_rows
from infra.export.run import export_dataset
from tests.support.trainer_data import golden_group, synthetic

FACTS = {
    "kind": "dpo", "source": "clickhouse", "format": "hf", "created_at": "2026-11-25T21:00:00+00:00",
    "seed": 3, "fractions": [0.8, 0.1, 0.1], "trajectories": 12,
    "splits": {
        "train": {"rows": 5, "tasks": 2, "files": ["data/train-00000-of-00001.parquet"]},
        "validation": {"rows": 1, "tasks": 1, "files": ["data/validation-00000-of-00001.parquet"]},
        "test": {"rows": 0, "tasks": 0, "files": []},
    },
    "reward_versions": ["rules-1", "rules-2"], "calibration_versions": ["cal-1"],
    "policy_versions": ["v3", "v4"],
    "source_offsets": {"trajectory.scored": {"0": 40, "1": 38}}, "batch_ids": [],
    "builder_config": {"min_margin": 0.05}, "command": "agentstream export --kind dpo --seed 3",
}  # fmt: skip


def test_card_says_counts_kind_reward_versions_offsets_and_how():
    card = render_card(FACTS)
    header = yaml.safe_load(card.split("---\n")[1])
    assert header["configs"] == [
        {
            "config_name": "default",
            "data_files": [
                {"split": "train", "path": ["data/train-00000-of-00001.parquet"]},
                {"split": "validation", "path": ["data/validation-00000-of-00001.parquet"]},
            ],
        }
    ]  # an empty split has no file and no entry
    assert "dpo" in header["tags"]
    for line in ("| train | 5 | 2 |", "| validation | 1 | 1 |", "| test | 0 | 0 |"):
        assert line in card
    assert "6 rows from 12 trajectories, exported from clickhouse as hf" in card
    assert "sha256(`3:<task_id>`)" in card  # the split rule with its seed
    assert "`total_reward`" in card and "reward versions: `rules-1`, `rules-2`" in card
    assert "policy versions: `v3`, `v4`" in card and "calibration versions: `cal-1`" in card
    assert "`trajectory.scored` partition 0: 40" in card and "partition 1: 38" in card
    assert "`agentstream export --kind dpo --seed 3`" in card and '"min_margin": 0.05' in card


def test_card_lists_batches_for_a_batch_export():
    card = render_card(FACTS | {"source": "batches", "batch_ids": ["dpo-abc", "dpo-def"]})
    assert "Batches: `dpo-abc`, `dpo-def`" in card


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf"])
def test_every_format_loads_with_load_dataset_from_the_directory(tmp_path, fmt):
    import datasets

    trajectories = synthetic(160)
    meta = {
        "trajectory_ids": [t.trajectory_id for t in trajectories], "content_hashes": [],
        "source_offsets": {}, "reward_versions": [], "calibration_versions": [], "policy_versions": [],
        "builder_config": {},
    }  # fmt: skip
    BatchStore(tmp_path / "data").write("sft", SFTBuilder().build(trajectories), meta)
    out = tmp_path / "out"
    summary = export_dataset(
        None, "sft", "batches", fmt, out, data_dir=tmp_path / "data", progress=lambda _: None
    )
    loaded = datasets.load_dataset(str(out))
    assert {name: split.num_rows for name, split in loaded.items()} == summary["splits"]
    assert json.loads((out / "export.json").read_text())["format"] == fmt


def test_rows_are_the_trainer_builders_rows_of_the_latest_distinct_revisions():
    group = golden_group()
    stale = group[0].model_copy(update={"revision": 0, "total_reward": 0.0, "event_id": "old"})
    newest = group[0].model_copy(update={"revision": 1})
    copy = group[1].model_copy(update={"trajectory_id": "task-a-copy"})  # same content: one example
    given = [stale, newest, *group[1:], copy]
    rows = build_rows(ExportConfig(kind="sft", require_success=False), given)
    # the stale revision is gone; of two copies of one content the first by trajectory id stays
    assert rows == SFTBuilder(SFTBuilderConfig(require_success=False)).build([copy, newest, *group[2:]])
    assert [r["reward"] for r in rows if r["trajectory_id"] == "task-a-t1"] == [0.9]
    pairs = build_rows(ExportConfig(kind="dpo_step"), [*golden_group("a"), *golden_group("b")])
    assert pairs == StepPairBuilder().build(golden_group("a")) + StepPairBuilder().build(golden_group("b"))
    grpo = build_rows(ExportConfig(kind="grpo"), golden_group())
    assert grpo == GRPOGroupBuilder(GRPOGroupConfig(retokenize=True)).build(golden_group())
    assert all(isinstance(r["prompt"], list) for r in grpo)

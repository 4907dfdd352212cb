"""Integration: `agentstream export` from a real chDB (filled through the sink's row mapping) and from
the trainer's batch files, in each format: `datasets.load_dataset(DIR)` finds train / validation /
test, no task is in two splits, the rows are what the trainer's builders make of the latest complete
revisions, the card names counts, versions and source offsets, and `--validate` passes the export
but names a planted duplicate and a planted leak (split, row, reason) and exits 1."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from consumers.batching.batch_writer import BatchStore
from consumers.batching.builders.dpo import DPOPairBuilder
from consumers.batching.builders.sft import SFTBuilder
from infra.export.config import ExportConfig
from infra.export.rows import build_rows, row_trajectory_ids
from infra.export.splits import split_of
from tests.support.trainer_data import synthetic

pytestmark = pytest.mark.integration

CASES = [("sft", "jsonl"), ("dpo", "parquet"), ("grpo", "hf")]


@pytest.fixture(scope="module")
def exports(filled_chdb, agentstream_export, tmp_path_factory):
    """kind -> (directory, finished process) of a `--reward-version rules-1` export from chDB."""
    root = tmp_path_factory.mktemp("exports")
    out = {}
    for kind, fmt in CASES:
        done = agentstream_export(
            "--clickhouse-url", filled_chdb, "--kind", kind, "--format", fmt, "--out", root / kind,
            "--reward-version", "rules-1",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        out[kind] = root / kind
    return out


def _load(directory) -> dict[str, list[dict]]:
    import datasets

    return {name: split.to_list() for name, split in datasets.load_dataset(str(directory)).items()}


def _ids(rows: list[dict]) -> list[tuple[str, ...]]:
    return sorted(tuple(row_trajectory_ids(r)) for r in rows)


@pytest.mark.parametrize(("kind", "fmt"), CASES)
def test_clickhouse_export_loads_split_by_task_with_the_builders_rows(
    exports, stored_trajectories, kind, fmt
):
    splits = _load(exports[kind])
    assert set(splits) == {"train", "validation", "test"}
    tasks = {name: {r["task_id"] for r in rows} for name, rows in splits.items()}
    assert not (tasks["train"] & tasks["validation"] or tasks["train"] & tasks["test"]), "a task leaked"
    assert not tasks["validation"] & tasks["test"]
    assert all(split_of(t) == name for name, ts in tasks.items() for t in ts)
    # only the latest revision of complete trajectories of reward version rules-1, as the builders make them
    latest = [t for t in stored_trajectories if t.event_id != "ev-old"]
    admitted = [t for t in latest if t.complete and t.reward_version == "rules-1"]
    expected = build_rows(ExportConfig(kind=kind), admitted)
    assert _ids([r for rows in splits.values() for r in rows]) == _ids(expected)
    assert "task-v2" not in set().union(*tasks.values()) and "task-incomplete" not in set().union(
        *tasks.values()
    )


def test_card_and_export_json_name_counts_versions_and_offsets(exports, stored_trajectories):
    directory = exports["sft"]
    card = (directory / "README.md").read_text()
    header = yaml.safe_load(card.split("---\n")[1])
    files = {f["split"]: f["path"] for f in header["configs"][0]["data_files"]}
    assert files == {s: [f"{s}.jsonl"] for s in ("train", "validation", "test")}
    facts = json.loads((directory / "export.json").read_text())
    counts = {name: len(rows) for name, rows in _load(directory).items()}
    assert {s: i["rows"] for s, i in facts["splits"].items()} == counts
    for name, n in counts.items():
        assert f"| {name} | {n} | {facts['splits'][name]['tasks']} |" in card
    assert facts["reward_versions"] == ["rules-1"] and "`rules-1`" in card and "`v0`" in card
    assert "total_reward" in card  # the reward definition
    # offsets of the trajectory.scored events behind the export: written at 0..N-1, partition = offset % 2
    assert set(facts["source_offsets"]) == {"trajectory.scored"}
    assert facts["source_offsets"]["trajectory.scored"].keys() == {"0", "1"}
    assert "--reward-version rules-1" in facts["command"] and facts["command"] in card


def test_validate_passes_the_export_and_names_a_planted_duplicate_and_leak(
    exports, agentstream_export, tmp_path
):
    clean = agentstream_export("--validate", exports["sft"])
    assert clean.returncode == 0, clean.stderr
    assert "valid" in clean.stdout
    planted = tmp_path / "planted"
    shutil.copytree(exports["sft"], planted)
    train = (planted / "train.jsonl").read_text().splitlines()
    test_rows = (planted / "test.jsonl").read_text().splitlines()
    (planted / "test.jsonl").write_text("\n".join([*test_rows, train[0]]) + "\n")
    task = json.loads(train[0])["task_id"]
    done = agentstream_export("--validate", planted)
    assert done.returncode == 1
    row = len(test_rows)
    assert f"test row {row}: leak: task '{task}' is also in train" in done.stderr
    assert f"test row {row}: duplicate: same content as train row 0" in done.stderr
    assert "2 problem(s)" in done.stderr


def test_batch_files_export_with_their_manifests_facts(agentstream_export, tmp_path):
    trajectories = synthetic(64)
    store = BatchStore(tmp_path / "data")
    rows = {"sft": SFTBuilder().build(trajectories), "dpo": DPOPairBuilder().build(trajectories[:4])}
    for i, chunk in enumerate((trajectories[:32], trajectories[32:])):
        ids = [t.trajectory_id for t in chunk]
        meta = {
            "trajectory_ids": ids, "content_hashes": [], "reward_versions": ["rules-1"],
            "source_offsets": {"trajectory.scored": {"0": 32 * (i + 1)}}, "calibration_versions": [],
            "policy_versions": [f"v{i}"], "builder_config": {"require_success": True},
        }  # fmt: skip
        store.write("sft", [r for r in rows["sft"] if r["trajectory_id"] in ids], meta)
    out = tmp_path / "out"
    args = ["--source", "batches", "--data-dir", tmp_path / "data", "--kind", "sft", "--format", "parquet"]
    done = agentstream_export(*args, "--out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "read batch" in done.stderr and "wrote train" in done.stderr  # progress lines
    splits = _load(out)
    assert sum(len(v) for v in splits.values()) == len(rows["sft"])
    facts = json.loads((out / "export.json").read_text())
    assert facts["source_offsets"] == {"trajectory.scored": {"0": 64}}
    assert facts["policy_versions"] == ["v0", "v1"] and len(facts["batch_ids"]) == 2
    assert all(f"`{b}`" in (out / "README.md").read_text() for b in facts["batch_ids"])
    again = agentstream_export(*args, "--out", out, "--json")  # replaces its own earlier export
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["splits"] == {s: i["rows"] for s, i in facts["splits"].items()}


def test_an_unmigrated_clickhouse_is_one_line_naming_the_url(agentstream_export, tmp_path):
    url = f"chdb://{tmp_path / 'empty'}"
    done = agentstream_export("--clickhouse-url", url, "--kind", "sft", "--out", tmp_path / "out")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"agentstream: error: --clickhouse-url {url}: ")
    assert not (tmp_path / "out").exists()

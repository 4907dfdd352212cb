"""`--validate`: a clean export passes; a planted duplicate, leak, empty message and schema error are
each found and named by split, row and reason, in JSONL and in Parquet."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from consumers.batching.batch_writer import BatchStore
from consumers.batching.builders.dpo import DPOPairBuilder
from consumers.batching.builders.sft import SFTBuilder, SFTBuilderConfig
from infra.export.checks import check
from infra.export.errors import ExportError
from infra.export.run import export_dataset, validate_dataset
from tests.support.trainer_data import golden_group, synthetic

META = {
    "content_hashes": [], "source_offsets": {}, "reward_versions": ["rules-1"],
    "calibration_versions": [], "policy_versions": ["v0"], "builder_config": {},
}  # fmt: skip


def _export(tmp_path, fmt: str = "jsonl", kind: str = "sft"):
    trajectories = synthetic(120)
    if kind == "sft":
        rows = SFTBuilder(SFTBuilderConfig(require_success=False)).build(trajectories)
    else:
        rows = [r for i in range(0, 120, 4) for r in DPOPairBuilder().build(trajectories[i : i + 4])]
    ids = [t.trajectory_id for t in trajectories]
    BatchStore(tmp_path / "data").write(kind, rows, META | {"trajectory_ids": ids})
    out = tmp_path / f"out-{fmt}"
    summary = export_dataset(
        None, kind, "batches", fmt, out, data_dir=tmp_path / "data", progress=lambda _: None
    )
    assert summary["problems"] == []
    return out


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _rewrite(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _reasons(report) -> list[str]:
    return [f"{p['split']} row {p['row']}: {p['reason']}" for p in report["problems"]]


def test_a_clean_export_is_valid(tmp_path):
    report = validate_dataset(_export(tmp_path))
    assert report["ok"] and report["kind"] == "sft" and sum(report["splits"].values()) == 120


def test_planted_duplicate_in_the_same_split_is_named(tmp_path):
    out = _export(tmp_path)
    train = _lines(out / "train.jsonl")
    _rewrite(out / "train.jsonl", [*train, train[3]])
    assert _reasons(validate_dataset(out)) == [
        f"train row {len(train)}: duplicate: same content as train row 3"
    ]


def test_planted_leak_is_named_with_the_split_the_task_is_also_in(tmp_path):
    out = _export(tmp_path)
    train, test = _lines(out / "train.jsonl"), _lines(out / "test.jsonl")
    leaked = train[0] | {"messages": [*train[0]["messages"], {"role": "user", "content": "and again"}]}
    _rewrite(out / "test.jsonl", [leaked, *test])
    assert _reasons(validate_dataset(out)) == [
        f"test row 0: leak: task {train[0]['task_id']!r} is also in train"
    ]


def test_planted_empty_message_and_schema_errors_are_named(tmp_path):
    out = _export(tmp_path)
    rows = _lines(out / "validation.jsonl")
    rows[0]["messages"][1]["content"] = "  "
    rows[1]["messages"][0]["role"] = "robot"
    del rows[2]["messages"]
    rows[3]["messages"] = []
    _rewrite(out / "validation.jsonl", rows)
    assert _reasons(validate_dataset(out)) == [
        "validation row 0: empty: messages[1] (user) has no content and no tool call",
        "validation row 1: schema: messages[0] has role 'robot' "
        "(expected one of assistant, system, tool, user)",
        "validation row 2: schema: no messages column (kind sft)",
        "validation row 3: empty: messages has no messages",
    ]


def test_parquet_export_validates_and_a_planted_duplicate_is_found(tmp_path):
    out = _export(tmp_path, "hf", kind="dpo")
    assert validate_dataset(out)["ok"]  # None-filled message keys are neither empty nor different
    path = out / "data" / "validation-00000-of-00001.parquet"
    table = pq.read_table(path)
    pq.write_table(_doubled(table), path)
    report = validate_dataset(out)
    assert report["kind"] == "dpo"
    assert _reasons(report) == [
        f"validation row {table.num_rows}: duplicate: same content as validation row 0"
    ]


def _doubled(table):
    import pyarrow as pa

    return pa.concat_tables([table, table.slice(0, 1)])


def test_dpo_checks_cover_text_rows_and_mixed_formats():
    rows = {
        "train": [
            {"task_id": "a", "prompt": "2+2?", "chosen": "4", "rejected": "5"},
            {
                "task_id": "b",
                "prompt": "q",
                "chosen": [{"role": "assistant", "content": "x"}],
                "rejected": "y",
            },
            {"task_id": "c", "prompt": "q", "chosen": "", "rejected": "y"},
        ]
    }
    assert [(p.row, p.reason) for p in check("dpo", rows)] == [
        (1, "schema: prompt, chosen, rejected mix text and conversations"),
        (2, "empty: chosen is empty"),
    ]


def test_an_empty_tool_turn_is_an_observation_not_an_empty_message():
    messages = [
        {"role": "user", "content": "do it"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "tool", "content": ""},
    ]
    assert check("sft", {"train": [{"task_id": "a", "messages": messages}]}) == []


def test_validate_refuses_a_directory_without_split_files(tmp_path):
    with pytest.raises(ExportError, match="no split files"):
        validate_dataset(tmp_path)


def test_golden_group_rows_have_no_problems():
    rows = SFTBuilder(SFTBuilderConfig(require_success=False)).build(golden_group())
    assert check("sft", {"train": rows}) == []


def test_grpo_token_rows_from_batch_files_are_refused_before_anything_is_written(tmp_path):
    rows = [{"task_id": "a", "trajectory_id": "t1", "input_ids": [1, 2], "labels": [1, 2]}]
    BatchStore(tmp_path / "data").write("grpo", rows, META | {"trajectory_ids": ["t1"]})
    with pytest.raises(ExportError, match=r"lack prompt .*--source clickhouse"):
        export_dataset(None, "grpo", "batches", "jsonl", tmp_path / "out", data_dir=tmp_path / "data")
    assert not (tmp_path / "out").exists()


def test_content_parts_count_as_content_and_empty_parts_as_empty():
    parts = [{"type": "text", "text": "hi"}]
    row = {"task_id": "a", "messages": [{"role": "user", "content": parts}]}
    blank = {"task_id": "b", "messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]}
    assert [p.reason for p in check("sft", {"train": [row, blank]})] == [
        "empty: messages[0] (user) has no content and no tool call"
    ]

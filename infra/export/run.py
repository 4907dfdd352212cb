"""`export_dataset` and `validate_dataset`: the shell around the pure parts (see the package
docstring for the API). Reads a source, builds rows, splits them by task, writes the files, the
card and `export.json`, then validates what it wrote."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from infra.export import files
from infra.export.card import render_card
from infra.export.checks import REQUIRED, check, infer_kind
from infra.export.config import ExportConfig
from infra.export.errors import ExportError
from infra.export.rows import build_rows, builder_settings, drop_empty_columns, row_trajectory_ids
from infra.export.sources import read_batches, read_offsets, read_trajectories
from infra.export.splits import SPLITS, assign

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


def export_dataset(
    client_or_url: Any,
    kind: str,
    source: str,
    fmt: str,
    out_dir: str | Path,
    *,
    data_dir: str | Path | None = None,
    split: str | Sequence[float] = (0.8, 0.1, 0.1),
    seed: int = 0,
    reward_versions: Sequence[str] = (),
    min_reward: float | None = None,
    require_success: bool = True,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Export one dataset to `out_dir`; returns its summary (see the package docstring)."""
    split_text = split if isinstance(split, str) else ",".join(str(f) for f in split)
    config = ExportConfig(
        kind=kind, source=source, format=fmt, out=Path(out_dir), split=split_text, seed=seed,
        reward_versions=tuple(reward_versions), min_reward=min_reward, require_success=require_success,
    )  # fmt: skip
    return run_export(config, client_or_url, data_dir, progress or log.info)


def run_export(config: ExportConfig, client_or_url: Any, data_dir, progress: Progress) -> dict[str, Any]:
    """The export `config` describes (the CLI calls this with its parsed config)."""
    if config.out is None:
        raise ExportError("--out: give the output directory")
    rows, facts = _collect(config, client_or_url, data_dir, progress)
    if not rows:
        raise ExportError(f"no {config.kind} rows to export from {config.source} (nothing matched)")
    progress(f"built {len(rows)} {config.kind} rows")
    _check_columns(config, rows)
    rows = drop_empty_columns(rows)
    splits = assign(rows, config.fractions, config.seed)
    out_dir = Path(config.out)
    facts = _write(config, out_dir, splits, facts)
    for name, info in facts["splits"].items():
        progress(f"wrote {name}: {info['rows']} rows, {info['tasks']} tasks")
    report = validate_dataset(out_dir)
    summary_keys = ("kind", "source", "format", "reward_versions", "policy_versions")
    return {
        "out_dir": str(out_dir),
        **{k: facts[k] for k in summary_keys},
        "rows": len(rows),
        "splits": {s: i["rows"] for s, i in facts["splits"].items()},
        "tasks": {s: i["tasks"] for s, i in facts["splits"].items()},
        "files": [f for i in facts["splits"].values() for f in i["files"]]
        + [files.CARD_FILE, files.EXPORT_FILE],
        "problems": report["problems"],
    }


def _write(config: ExportConfig, out_dir: Path, splits, facts: dict[str, Any]) -> dict[str, Any]:
    """Split files, card and `export.json` (which lists every file, so a later export replaces
    only these) into a staging directory, renamed into place at the end (removed on failure)."""
    tmp = files.staging_dir(out_dir)
    try:
        written = files.write_splits(tmp, config.format, splits)
        facts = facts | _split_facts(config, splits, written)
        split_paths = [f for names in written.values() for f in names]
        facts["files"] = [*split_paths, files.CARD_FILE, files.EXPORT_FILE]
        (tmp / files.CARD_FILE).write_text(render_card(facts))
        (tmp / files.EXPORT_FILE).write_bytes(orjson.dumps(facts, option=orjson.OPT_INDENT_2))
        files.publish(tmp, out_dir)
    except BaseException:
        files.discard(tmp)
        raise
    return facts


def _check_columns(config: ExportConfig, rows: list[dict[str, Any]]) -> None:
    """Refuse rows that lack the kind's TRL columns before writing anything (e.g. GRPO token rows)."""
    missing = [c for c in REQUIRED[config.kind] if any(c not in r for r in rows)]
    if missing:
        hint = " (GRPO batch files of token rows: export GRPO with --source clickhouse)"
        raise ExportError(
            f"--kind {config.kind}: rows from {config.source} lack {', '.join(missing)}"
            + (hint if config.kind == "grpo" and config.source == "batches" else "")
        )


def _collect(config: ExportConfig, client_or_url: Any, data_dir, progress: Progress):
    if config.source == "batches":
        if data_dir is None:
            raise ExportError("--source batches: give --data-dir (where batches/<kind>/ is)")
        return _from_batches(config, data_dir, progress)
    if client_or_url is None:
        raise ExportError("--source clickhouse: give --clickhouse-url")
    from clickhouse_connect.driver.exceptions import DatabaseError

    where = client_or_url if isinstance(client_or_url, str) else "the ClickHouse client"
    try:
        if not isinstance(client_or_url, str):
            return _from_clickhouse(config, client_or_url, progress)
        from clients.clickhouse.client import connect

        client = connect(client_or_url, wait_s=5.0)
        try:
            return _from_clickhouse(config, client, progress)
        finally:
            client.close()
    except DatabaseError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(
            f"--clickhouse-url {where}: {first} (is the stack up, or its tables migrated?)"
        ) from None


def _from_clickhouse(config: ExportConfig, client, progress: Progress):
    trajectories = read_trajectories(client, config.reward_versions, progress)
    rows = build_rows(config, trajectories)
    used = {i for row in rows for i in row_trajectory_ids(row)}
    kept = [t for t in trajectories if t.trajectory_id in used]
    facts = _base_facts(config) | {
        "trajectories": len(kept),
        "reward_versions": sorted({t.reward_version for t in kept if t.reward_version}),
        "reward_definitions": sorted({t.definition() for t in kept}),
        "calibration_versions": sorted({t.calibration_version for t in kept if t.calibration_version}),
        "policy_versions": sorted({t.policy_version for t in kept if t.policy_version}),
        "source_offsets": read_offsets(client, config.reward_versions),
        "batch_ids": [],
        "builder_config": builder_settings(config),
    }
    return rows, facts


def _from_batches(config: ExportConfig, data_dir, progress: Progress):
    source = read_batches(data_dir, config.kind, config.reward_versions, progress)
    ms = source.manifests
    offsets: dict[str, dict[str, int]] = {}
    for m in ms:
        for topic, parts in m.source_offsets.items():
            for partition, offset in parts.items():
                held = offsets.setdefault(topic, {})
                held[partition] = max(held.get(partition, 0), int(offset))
    configs = list(
        {orjson.dumps(m.builder_config, option=orjson.OPT_SORT_KEYS): m.builder_config for m in ms}.values()
    )
    facts = _base_facts(config) | {
        "trajectories": len({i for m in ms for i in m.trajectory_ids}),
        "reward_versions": sorted({v for m in ms for v in m.reward_versions}),
        "reward_definitions": sorted({d for m in ms for d in m.builder_config.get("reward_definitions", [])}),
        "calibration_versions": sorted({v for m in ms for v in m.calibration_versions}),
        "policy_versions": sorted({v for m in ms for v in m.policy_versions}),
        "source_offsets": offsets,
        "batch_ids": [m.batch_id for m in ms],
        "builder_config": configs[0] if len(configs) == 1 else configs,
    }
    return source.rows, facts


def _base_facts(config: ExportConfig) -> dict[str, Any]:
    return {
        "kind": config.kind,
        "source": config.source,
        "format": config.format,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "seed": config.seed,
        "fractions": list(config.fractions),
        "config": config.to_dict(),
        "command": command_line(config),
    }


def command_line(config: ExportConfig) -> str:
    """The `agentstream export` command that makes this export again."""
    parts = ["agentstream export", f"--kind {config.kind}", f"--source {config.source}"]
    parts += [f"--format {config.format}", f"--out {config.out}", f"--split {config.split}"]
    parts += [f"--seed {config.seed}"]
    if config.reward_versions:
        parts.append(f"--reward-version {','.join(config.reward_versions)}")
    if config.kind == "sft":
        parts.append(f"--require-success {str(config.require_success).lower()}")
        if config.min_reward is not None:
            parts.append(f"--min-reward {config.min_reward}")
    return " ".join(parts)


def _split_facts(config: ExportConfig, splits, written) -> dict[str, Any]:
    return {
        "splits": {
            name: {
                "rows": len(rows),
                "tasks": len({r["task_id"] for r in rows}),
                "files": written.get(name, []),
            }
            for name, rows in splits.items()
        }
    }


def validate_dataset(out_dir: str | Path) -> dict[str, Any]:
    """Check an export directory (see `checks.py`); returns the report (see the package docstring)."""
    directory = Path(out_dir)
    if not directory.is_dir():
        raise ExportError(f"--validate: {directory} is not a directory")
    found = files.split_files(directory)
    if not found:
        raise ExportError(
            f"--validate: no split files (<split>.jsonl, <split>.parquet, data/<split>-*.parquet) "
            f"in {directory}"
        )
    order = sorted(found, key=lambda s: (SPLITS.index(s) if s in SPLITS else len(SPLITS), s))
    splits = {name: files.read_split(found[name]) for name in order}
    kind = files.read_export_facts(directory).get("kind") or infer_kind(
        {k for rows in splits.values() for r in rows[:1] if isinstance(r, dict) for k in r}
    )
    problems = check(kind, splits)
    return {
        "ok": not problems,
        "kind": kind,
        "splits": {name: len(rows) for name, rows in splits.items()},
        "problems": [p.to_dict() for p in problems],
    }

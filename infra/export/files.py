"""Writing an export's split files and reading any export back (I/O only).

Layouts (every one loads with `datasets.load_dataset(DIR)`, which reads the card's `configs`):
- `jsonl`: `<split>.jsonl`
- `parquet`: `<split>.parquet`
- `hf`: `data/<split>-00000-of-00001.parquet` (the Hub's layout)
Parquet splits share one Arrow schema (inferred over every row of every split), so `datasets` sees
the same features in each. An empty split has no file. The export is written into a sibling
temporary directory and renamed into place, so a reader never sees half an export.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from infra.export.errors import ExportError

Row = dict[str, Any]
EXPORT_FILE = "export.json"
CARD_FILE = "README.md"
_SPLIT_FILE = re.compile(r"^(?P<split>[a-z]+)(-\d{5}-of-\d{5})?\.(?P<ext>jsonl|parquet)$")


def split_path(fmt: str, split: str) -> str:
    """The file of a split, relative to the export directory.

    >>> split_path("hf", "train"), split_path("jsonl", "test")
    ('data/train-00000-of-00001.parquet', 'test.jsonl')
    """
    if fmt == "hf":
        return f"data/{split}-00000-of-00001.parquet"
    return f"{split}.{'jsonl' if fmt == 'jsonl' else 'parquet'}"


def staging_dir(out_dir: Path) -> Path:
    """A fresh temporary directory beside `out_dir` (same file system, so the rename is atomic)."""
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / EXPORT_FILE).exists():
        raise ExportError(f"--out: {out_dir} is not empty and holds no export; choose another directory")
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def publish(tmp: Path, out_dir: Path) -> None:
    """Replace `out_dir` (an earlier export, or nothing) with the finished `tmp`."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)


def write_splits(directory: Path, fmt: str, splits: Mapping[str, Sequence[Row]]) -> dict[str, list[str]]:
    """Write each non-empty split; returns split -> its files (relative paths)."""
    keys = list(dict.fromkeys(k for rows in splits.values() for r in rows for k in r))
    schema = _schema(splits, keys) if fmt != "jsonl" else None
    files: dict[str, list[str]] = {}
    for split, rows in splits.items():
        files[split] = []
        if not rows:
            continue
        relative = split_path(fmt, split)
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if schema is None:
            path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        else:
            _write_parquet(path, rows, keys, schema)
        files[split].append(relative)
    return files


def _pyarrow():
    """pyarrow (the `train` extra), or an error naming the option that needs it."""
    try:
        import pyarrow as pa
        import pyarrow.parquet  # makes pa.parquet available
    except ImportError:
        raise ExportError(
            "--format parquet / hf (and reading .parquet splits) need pyarrow: "
            "pip install 'agentstream[train]'"
        ) from None
    return pa


def _schema(splits: Mapping[str, Sequence[Row]], keys: list[str]):
    pa = _pyarrow()
    every = [{k: r.get(k) for k in keys} for rows in splits.values() for r in rows]
    return pa.Table.from_pylist(every).schema if every else None


def _write_parquet(path: Path, rows: Sequence[Row], keys: list[str], schema) -> None:
    pa = _pyarrow()
    table = pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows], schema=schema)
    pa.parquet.write_table(table, path)


def split_files(directory: Path) -> dict[str, list[Path]]:
    """The split files of an export directory, by split name (train, validation, test, ...)."""
    found: dict[str, list[Path]] = {}
    for path in sorted([*directory.glob("*.*"), *directory.glob("data/*.*")]):
        match = _SPLIT_FILE.match(path.name)
        if match:
            found.setdefault(match["split"], []).append(path)
    return found


def read_split(paths: Sequence[Path]) -> list[Row]:
    """The rows of one split's files, in file order."""
    rows: list[Row] = []
    for path in paths:
        if path.suffix == ".parquet":
            rows += _pyarrow().parquet.read_table(path).to_pylist()
        else:
            rows += _read_jsonl(path)
    return rows


def _read_jsonl(path: Path) -> list[Row]:
    rows = []
    for n, line in enumerate(path.read_bytes().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(orjson.loads(line))
            except orjson.JSONDecodeError as exc:
                raise ExportError(f"{path}: line {n} is not JSON ({exc})") from None
    return rows


def read_export_facts(directory: Path) -> dict[str, Any]:
    """`export.json` of an export ({} when it has none: a hand-made directory)."""
    path = directory / EXPORT_FILE
    return orjson.loads(path.read_bytes()) if path.exists() else {}

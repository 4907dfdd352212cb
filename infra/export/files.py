"""Writing an export's split files and reading any export back (I/O only).

Layouts (every one loads with `datasets.load_dataset(DIR)`, which reads the card's `configs`):
- `jsonl`: `<split>.jsonl`
- `parquet`: `<split>.parquet`
- `hf`: `data/<split>-00000-of-00001.parquet` (the Hub's layout)
Parquet splits share one Arrow schema (inferred over every row of every split), so `datasets` sees
the same features in each. An empty split has no file. The export is written into a sibling
temporary directory and renamed into place, so a reader never sees half an export.

Replacing: an export deletes only what an export wrote. A directory is replaced only when it holds
nothing but the files its own `export.json` lists (each named as an export names its files, each a
plain file, no link); anything else there (a file a person added, a planted `export.json` beside a
project) makes the export refuse, naming the entries. The old export is renamed aside, the new one
renamed in, then the listed files are unlinked one by one: never a recursive delete.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from infra.export.errors import ExportError

log = logging.getLogger(__name__)

Row = dict[str, Any]
EXPORT_FILE = "export.json"
CARD_FILE = "README.md"
_SPLIT_FILE = re.compile(r"^(?P<split>[a-z]+)(-\d{5}-of-\d{5})?\.(?P<ext>jsonl|parquet)$")
DATA_DIR = "data"  # the `hf` layout's only folder
SHOWN = 5  # stray entries named in a refusal


def split_path(fmt: str, split: str) -> str:
    """The file of a split, relative to the export directory.

    >>> split_path("hf", "train"), split_path("jsonl", "test")
    ('data/train-00000-of-00001.parquet', 'test.jsonl')
    """
    if fmt == "hf":
        return f"data/{split}-00000-of-00001.parquet"
    return f"{split}.{'jsonl' if fmt == 'jsonl' else 'parquet'}"


def confined(root: Path, given: str, field: str) -> Path:
    """`given` (a relative path) under `root`, resolved: refused, naming `field` and the value, when
    it is absolute, climbs with `..`, is `root` itself, or leads out through a symbolic link.

    >>> confined(Path("/srv/exports"), "sft/run-1", "out_dir").as_posix()
    '/srv/exports/sft/run-1'
    >>> confined(Path("/srv/exports"), "../x", "out_dir")
    Traceback (most recent call last):
    ...
    infra.export.errors.ExportError: out_dir='../x': must be relative, under the exports directory, no '..'
    """
    relative = Path(given)
    if not given.strip() or "\x00" in given or relative.is_absolute() or ".." in relative.parts:
        raise ExportError(f"{field}={given!r}: must be relative, under the exports directory, no '..'")
    base = root.resolve()
    target = (base / relative).resolve()
    if target == base or not target.is_relative_to(base):
        raise ExportError(f"{field}={given!r}: resolves to {target}, outside the exports directory {base}")
    return target


def staging_dir(out_dir: Path) -> Path:
    """A fresh temporary directory beside `out_dir` (same file system, so the rename is atomic),
    after checking that `out_dir` is nothing or an export that may be replaced (`replaceable`)."""
    replaceable(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{uuid.uuid4().hex[:12]}")
    tmp.mkdir()  # a new name: never one that exists (and so never someone else's to clean up)
    return tmp


def replaceable(out_dir: Path) -> list[str]:
    """The files of the earlier export at `out_dir` (relative paths; [] for nothing or an empty
    directory); raises ExportError when `out_dir` holds anything an export did not write."""
    if out_dir.is_symlink():
        raise ExportError(f"--out: {out_dir} is a symbolic link; give the directory itself")
    if not out_dir.exists():
        return []
    if not out_dir.is_dir():
        raise ExportError(f"--out: {out_dir} exists and is not a directory")
    entries = _entries(out_dir)
    if not entries:
        return []
    manifest = out_dir / EXPORT_FILE
    if EXPORT_FILE not in entries or manifest.is_symlink():
        raise ExportError(f"--out: {out_dir} is not empty and holds no export; choose another directory")
    listed = listed_files(out_dir)
    stray = sorted(set(entries) - set(listed) - {DATA_DIR})
    stray += [e for e in listed if e in entries and not _plain_file(out_dir / e)]
    if DATA_DIR in entries and not _plain_dir(out_dir / DATA_DIR):
        stray.append(DATA_DIR)
    if stray:
        shown = ", ".join(stray[:SHOWN]) + (f" and {len(stray) - SHOWN} more" if len(stray) > SHOWN else "")
        raise ExportError(
            f"--out: {out_dir} holds entries its {EXPORT_FILE} does not list ({shown}); an export "
            "replaces only a directory it wrote: remove them or choose another directory"
        )
    return [e for e in listed if e in entries]


def listed_files(directory: Path) -> list[str]:
    """The files an export's own `export.json` says it wrote, keeping only names an export gives
    its files (a hand-edited or planted manifest cannot name anything else)."""
    try:
        facts = orjson.loads((directory / EXPORT_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ExportError(f"--out: {directory / EXPORT_FILE} cannot be read as JSON ({exc})") from None
    if not isinstance(facts, dict):
        return [EXPORT_FILE]
    named = facts.get("files")
    if not isinstance(named, list):  # exports written before `files` was recorded
        splits = facts.get("splits") if isinstance(facts.get("splits"), dict) else {}
        named = [f for info in splits.values() if isinstance(info, dict) for f in info.get("files") or []]
        named += [CARD_FILE]
    names = {n for n in named if isinstance(n, str) and export_file_name(n)}
    return sorted(names | {EXPORT_FILE})


def export_file_name(name: str) -> bool:
    """Whether `name` is a path an export writes (relative, inside its directory).

    >>> [export_file_name(n) for n in ("train.jsonl", "data/test-00000-of-00001.parquet", "README.md")]
    [True, True, True]
    >>> [export_file_name(n) for n in ("../x.jsonl", "/etc/passwd", "notes.txt", "data/../README.md")]
    [False, False, False, False]
    """
    if name in (CARD_FILE, EXPORT_FILE):
        return True
    parts = name.split("/")
    if len(parts) == 2 and parts[0] == DATA_DIR:
        parts = parts[1:]
    return len(parts) == 1 and _SPLIT_FILE.match(parts[0]) is not None


def _entries(directory: Path) -> list[str]:
    """Every entry under `directory` as a relative path, without following links."""
    out = []
    for root, dirs, names in os.walk(directory):
        rel = Path(root).relative_to(directory)
        out += [(rel / n).as_posix() for n in [*dirs, *names]]
    return out


def _plain_file(path: Path) -> bool:
    return not path.is_symlink() and path.is_file()


def _plain_dir(path: Path) -> bool:
    return not path.is_symlink() and path.is_dir()


def publish(tmp: Path, out_dir: Path) -> None:
    """Replace `out_dir` (an earlier export, or nothing) with the finished `tmp`: the old export is
    renamed aside, the new one renamed in, then only the old export's listed files are removed."""
    old = replaceable(out_dir)  # again: the directory may have changed while the export ran
    if not out_dir.exists():
        os.replace(tmp, out_dir)
        return
    if not old:  # an empty directory
        out_dir.rmdir()
        os.replace(tmp, out_dir)
        return
    aside = out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex[:12]}")
    os.replace(out_dir, aside)
    os.replace(tmp, out_dir)
    remove_listed(aside, old)


def remove_listed(directory: Path, names: Sequence[str]) -> None:
    """Unlink `names` (files an export wrote) in `directory`, then the directory if that empties
    it; anything else found there is left in place, with a warning."""
    for name in names:
        path = directory / name
        if _plain_file(path):
            path.unlink()
    for folder in (directory / DATA_DIR, directory):
        try:
            if _plain_dir(folder):
                folder.rmdir()
        except OSError:
            log.warning("export: %s still holds files no export wrote; left in place", folder)
            return


def discard(tmp: Path) -> None:
    """Remove the staging directory `staging_dir` made for this run (after a failure)."""
    if _plain_dir(tmp) and tmp.name.startswith("."):
        shutil.rmtree(tmp, ignore_errors=True)


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

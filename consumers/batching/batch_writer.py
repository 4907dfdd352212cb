"""Batch files and their manifests, written atomically; and the recovery scan that reads them back.

Commit protocol (one batch): write the rows to `<id>.jsonl.tmp`, fsync, rename to `<id>.jsonl`,
then the manifest the same way (`<id>.manifest.json`: the commit point), fsync the directory. After
the `batch.built` event is acknowledged, an empty `<id>.published` marker is written. On start,
`BatchStore.recover()` deletes `*.tmp` files and data files that have no manifest (their
trajectories were never committed and will be replayed), and returns what the manifests say is
already batched, plus the manifests whose event may be missing (no marker): the consumer re-publishes
those with the same deterministic event id.

Since 1.5 the rows also travel in the log (`consumers.batching.row_chunks`): the manifest records how
many `batch.rows` chunks precede the event and the rows' canonical checksum. The file stays the
trainer's own record (recovery re-publishes the chunks from it); an executor no longer reads it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from clients.files import fsync_dir
from consumers.batching.kinds import KINDS
from consumers.batching.row_chunks import chunk_events, chunk_rows, rows_sha256
from consumers.errors import TrainerError
from schemas.events import BatchBuilt, BatchRows
from schemas.ids import derived_event_id

log = logging.getLogger(__name__)

PRODUCER = "trainer"


@dataclass(frozen=True)
class BatchManifest:
    batch_id: str
    kind: str
    path: str
    format: str
    row_count: int
    trajectory_ids: list[str]
    content_hashes: list[str]
    source_offsets: dict[str, dict[str, int]]
    reward_versions: list[str]
    calibration_versions: list[str]
    policy_versions: list[str]
    builder_config: dict[str, Any]
    sha256: str
    created_at: str
    sequence: int
    extra: dict[str, Any] = field(default_factory=dict)
    source_ranges: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    """topic -> partition -> [first, last] offset of the records the batch was built from."""
    chunks: int = 0
    """`batch.rows` events carrying the rows before the event (0: a manifest from before 1.5)."""
    rows_sha256: str = ""
    """sha256 of the rows' canonical JSONL, as the chunks carry them ('' before 1.5)."""

    def event(self) -> BatchBuilt:
        """The `batch.built` event; its id depends only on the batch, so a re-publish is a duplicate."""
        return BatchBuilt(
            event_id=derived_event_id("batch.built", self.batch_id, self.sha256),
            trajectory_id=self.batch_id,
            occurred_at=datetime.fromisoformat(self.created_at),
            producer=PRODUCER,
            batch_id=self.batch_id,
            kind=self.kind,
            path=self.path,
            format=self.format,
            row_count=self.row_count,
            trajectory_ids=self.trajectory_ids,
            source_offsets=self.source_offsets,
            source_ranges=self.source_ranges,
            reward_versions=self.reward_versions,
            calibration_versions=self.calibration_versions,
            policy_versions=self.policy_versions,
            builder_config=self.builder_config,
            sha256=self.sha256,
            chunks=self.chunks,
            rows_sha256=self.rows_sha256,
        )

    def events(self) -> list[BatchRows | BatchBuilt]:
        """Everything published for this batch, in order: its `batch.rows` chunks (the rows read back
        from its file) and then its `batch.built`."""
        chunks = self.chunk_events(read_rows(self.path)) if self.chunks else []
        return [*chunks, self.event()]

    def chunk_events(self, rows: list[dict[str, Any]]) -> list[BatchRows]:
        """The `batch.rows` events of `rows` (the batch's rows, as the file holds them), the same
        events (ids included) on every call; none for a manifest from before 1.5."""
        if not self.chunks:
            return []
        events = chunk_events(
            self.batch_id, self.kind, rows, datetime.fromisoformat(self.created_at), PRODUCER
        )
        if len(events) != self.chunks or (events and events[0].rows_sha256 != self.rows_sha256):
            raise TrainerError(
                f"batch {self.batch_id}: its rows in {self.path} no longer match the manifest "
                f"(chunks {len(events)} vs {self.chunks}, rows_sha256 vs {self.rows_sha256!r})"
            )
        return events


@dataclass
class Recovered:
    """What the manifests on disk say."""

    trajectory_ids: dict[str, set[str]] = field(default_factory=lambda: {k: set() for k in KINDS})
    content_hashes: dict[str, set[str]] = field(default_factory=lambda: {k: set() for k in KINDS})
    manifests: list[BatchManifest] = field(default_factory=list)
    unpublished: list[BatchManifest] = field(default_factory=list)


def batch_id_for(kind: str, trajectory_ids: list[str]) -> str:
    """Deterministic in the batch's kind and members.

    >>> batch_id_for("sft", ["b", "a"]) == batch_id_for("sft", ["a", "b"])
    True
    """
    digest = hashlib.sha256("\n".join([kind, *sorted(trajectory_ids)]).encode()).hexdigest()
    return f"{kind}-{digest[:20]}"


def atomic_write(path: Path, data: bytes) -> None:
    """temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def encode_rows(rows: list[dict[str, Any]], fmt: str) -> bytes:
    if fmt == "parquet":
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        # from_pylist takes its columns from the first row: give every row every key
        keys = list(dict.fromkeys(k for r in rows for k in r))
        buffer = io.BytesIO()
        pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows]), buffer)
        return buffer.getvalue()
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a batch file (JSONL or Parquet)."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


class BatchStore:
    """Batch files under `<data_dir>/batches/<kind>/`."""

    def __init__(self, data_dir: str | Path):
        self.root = Path(data_dir) / "batches"

    def kind_dir(self, kind: str) -> Path:
        path = self.root / kind
        path.mkdir(parents=True, exist_ok=True)
        return path

    def write(
        self,
        kind: str,
        rows: list[dict[str, Any]],
        meta: dict[str, Any],
        fmt: str = "jsonl",
    ) -> BatchManifest:
        """Write one batch; `meta` holds the manifest fields other than the file facts."""
        directory = self.kind_dir(kind)
        batch_id = batch_id_for(kind, meta["trajectory_ids"])
        existing = directory / f"{batch_id}.manifest.json"
        if existing.exists():
            return load_manifest(existing)
        data = encode_rows(rows, fmt)
        data_path = directory / f"{batch_id}.{fmt}"
        chunk_rows(rows, batch_id)  # a row no event can carry is refused before anything is written
        atomic_write(data_path, data)
        # the chunks carry the rows as the file gives them back (Parquet fills absent keys with None)
        travelling = rows if fmt == "jsonl" else read_rows(data_path)
        manifest = BatchManifest(
            batch_id=batch_id,
            kind=kind,
            path=str(data_path.resolve()),
            format=fmt,
            row_count=len(rows),
            sha256=hashlib.sha256(data).hexdigest(),
            created_at=datetime.now(UTC).isoformat(),
            sequence=sum(1 for _ in directory.glob("*.manifest.json")),
            chunks=len(chunk_rows(travelling, batch_id)),
            rows_sha256=rows_sha256(travelling),
            **meta,
        )
        atomic_write(existing, orjson.dumps(asdict(manifest), option=orjson.OPT_INDENT_2))
        log.info(
            "wrote batch %s: %d rows from %d trajectories", batch_id, len(rows), len(manifest.trajectory_ids)
        )
        return manifest

    def mark_published(self, manifest: BatchManifest) -> None:
        marker = self.kind_dir(manifest.kind) / f"{manifest.batch_id}.published"
        marker.touch()

    def recover(self) -> Recovered:
        state = Recovered()
        for kind in KINDS:
            directory = self.kind_dir(kind)
            for tmp in directory.glob("*.tmp"):
                log.info("recovery: removing unfinished %s", tmp.name)
                tmp.unlink()
            manifests = sorted(
                (load_manifest(p) for p in directory.glob("*.manifest.json")), key=lambda m: m.sequence
            )
            committed = {m.batch_id for m in manifests}
            for data in [*directory.glob("*.jsonl"), *directory.glob("*.parquet")]:
                if data.name.rsplit(".", 1)[0] not in committed:
                    log.info(
                        "recovery: removing %s (no manifest; its trajectories will be replayed)", data.name
                    )
                    data.unlink()
            for m in manifests:
                state.trajectory_ids[kind].update(m.trajectory_ids)
                state.content_hashes[kind].update(m.content_hashes)
                state.manifests.append(m)
                if not (directory / f"{m.batch_id}.published").exists():
                    state.unpublished.append(m)
        return state

    def manifests(self, kind: str | None = None) -> list[BatchManifest]:
        kinds = [kind] if kind else list(KINDS)
        return [load_manifest(p) for k in kinds for p in sorted(self.kind_dir(k).glob("*.manifest.json"))]


def load_manifest(path: Path) -> BatchManifest:
    return BatchManifest(**orjson.loads(path.read_bytes()))

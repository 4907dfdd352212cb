"""Where an export reads from (I/O only; rows are built in `rows.py`).

- ClickHouse: `agentstream.trajectories FINAL` (the latest revision of each complete trajectory,
  its steps from the `steps` JSON column), read in pages of `PAGE` by trajectory id; the source
  offsets are those of the `trajectory.scored` events behind them (`agentstream.events`). Every
  value is a bound parameter.
- Batch files: the manifests under `<data dir>/batches/<kind>/` and the files they name (or the
  file of the same id beside the manifest, when the data directory was moved).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from consumers.batching.batch_writer import BatchManifest, load_manifest, read_rows
from infra.clickhouse.sql import Sql, run, run_dicts
from infra.export.errors import ExportError
from schemas.events import ScoredStep, TrajectoryScored

log = logging.getLogger(__name__)

PAGE = 2000
Progress = Callable[[str], None]

COLUMNS = (
    "trajectory_id, revision, event_id, occurred_at, task_id, task, domain, agent, model, "
    "policy_version, group_id, success, total_steps, outcome_score, process_score, efficiency_score, "
    "total_reward, complete, missing, reward_version, reward_definition, calibration_version, started_at, "
    "ended_at, steps, metadata"
)
FILTER = (  # evaluation episodes (purpose 'eval', schema 1.5) never become training data
    "complete = 1 AND purpose = 'train' AND if(length({versions:Array(String)}) = 0, "
    "reward_version = (SELECT reward_version FROM agentstream.reward_version_default), "
    "has({versions:Array(String)}, reward_version))"
)


@dataclass
class BatchSource:
    """Rows read from batch files, with what their manifests say."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    manifests: list[BatchManifest] = field(default_factory=list)


def trajectory_from_row(row: dict[str, Any]) -> TrajectoryScored:
    """A `trajectory.scored` event from its `agentstream.trajectories` row (token ids are not stored)."""
    values = dict(row)
    values["steps"] = [ScoredStep.model_validate(s) for s in orjson.loads(values["steps"] or "[]")]
    values["metadata"] = orjson.loads(values["metadata"] or "{}")
    values["success"] = None if values["success"] is None else bool(values["success"])
    values["complete"] = bool(values["complete"])
    for key in ("occurred_at", "started_at", "ended_at"):
        if isinstance(values[key], datetime) and values[key].tzinfo is None:
            values[key] = values[key].replace(tzinfo=UTC)
    return TrajectoryScored(producer="clickhouse", **values)


def read_trajectories(
    client, reward_versions: tuple[str, ...] = (), progress: Progress = log.info
) -> list[TrajectoryScored]:
    """Every complete trajectory (latest revision), optionally only of some reward versions."""
    out: list[TrajectoryScored] = []
    after = ""
    while True:
        page = run_dicts(
            client,
            Sql(
                f"SELECT {COLUMNS} FROM agentstream.trajectories FINAL WHERE {FILTER} "
                "AND trajectory_id > {after:String} ORDER BY trajectory_id LIMIT {page:UInt32}",
                {"versions": list(reward_versions), "after": after, "page": PAGE},
            ),
        )
        out += [trajectory_from_row(r) for r in page]
        if page:
            progress(f"read {len(out)} trajectories from ClickHouse")
        if len(page) < PAGE:
            return out
        after = page[-1]["trajectory_id"]


def read_offsets(client, reward_versions: tuple[str, ...] = ()) -> dict[str, dict[str, int]]:
    """topic -> partition -> next offset after the newest `trajectory.scored` event exported."""
    rows = run(
        client,
        Sql(
            "SELECT topic, partition, max(offset) + 1 FROM agentstream.events "
            "WHERE type = 'trajectory.scored' AND event_id IN "
            f"(SELECT event_id FROM agentstream.trajectories FINAL WHERE {FILTER}) "
            "GROUP BY topic, partition ORDER BY topic, partition",
            {"versions": list(reward_versions)},
        ),
    )
    out: dict[str, dict[str, int]] = {}
    for topic, partition, offset in rows:
        out.setdefault(str(topic), {})[str(partition)] = int(offset)
    return out


def read_batches(
    data_dir: str | Path, kind: str, reward_versions: tuple[str, ...] = (), progress: Progress = log.info
) -> BatchSource:
    """The rows of every `kind` batch under `<data_dir>/batches/<kind>/`, oldest batch first; with
    `reward_versions`, only batches every reward version of which is among them."""
    directory = Path(data_dir) / "batches" / kind
    paths = sorted(directory.glob("*.manifest.json"))
    if not paths:
        raise ExportError(f"--source batches: no {kind} batch manifests in {directory}")
    manifests = sorted((load_manifest(p) for p in paths), key=lambda m: (m.sequence, m.batch_id))
    wanted = set(reward_versions)
    source = BatchSource()
    for m in manifests:
        if wanted and not (m.reward_versions and set(m.reward_versions) <= wanted):
            continue
        source.rows += read_rows(_data_file(m, directory))
        source.manifests.append(m)
        progress(f"read batch {m.batch_id}: {m.row_count} rows ({len(source.rows)} in all)")
    return source


def _data_file(manifest: BatchManifest, directory: Path) -> Path:
    named = Path(manifest.path)
    if named.exists():
        return named
    beside = directory / f"{manifest.batch_id}.{manifest.format}"
    if beside.exists():
        return beside
    raise ExportError(f"batch {manifest.batch_id}: data file {manifest.path} not found (nor {beside})")

"""What trained a policy version, down to the step events: the queries and the report of
`agentstream lineage VERSION` and the console's version page. The caller passes `query(sql) -> list[dict]`
(sql: an `Sql`); no connection here.

The walk: `policy_versions` (parent, method, metrics, staleness, lineage) -> `batches` (kind, rows,
source offsets) -> `trajectories` (which version sampled each) -> `steps` (event id and the policy
version that produced each step), summarised as step counts per producing version.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from clients.clickhouse import DATABASE, ClickHouseError
from infra.clickhouse.sql import Sql

Query = Any  # Callable[[Sql], list[dict]]: the values are bound by ClickHouse, never quoted here


def version_sql(version: str) -> Sql:
    return Sql(
        f"SELECT * FROM {DATABASE}.policy_versions FINAL WHERE policy_version = {{v:String}}", {"v": version}
    )


def batches_sql(batch_ids: list[str]) -> Sql:
    return Sql(
        "SELECT batch_id, kind, row_count, path, trajectory_ids, source_offsets, policy_versions "
        f"FROM {DATABASE}.batches FINAL WHERE batch_id IN {{ids:Array(String)}} ORDER BY batch_id",
        {"ids": list(batch_ids)},
    )


def trajectories_sql(trajectory_ids: list[str]) -> Sql:
    return Sql(
        "SELECT trajectory_id, policy_version, success, total_reward, total_steps "
        f"FROM {DATABASE}.trajectories FINAL WHERE trajectory_id IN {{ids:Array(String)}} "
        f"AND reward_version IN (SELECT reward_version FROM {DATABASE}.trajectory_versions WHERE live) "
        "ORDER BY trajectory_id",
        {"ids": list(trajectory_ids)},
    )


def steps_sql(trajectory_ids: list[str]) -> Sql:
    return Sql(
        "SELECT event_id, trajectory_id, step_index, policy_version "
        f"FROM {DATABASE}.steps FINAL WHERE trajectory_id IN {{ids:Array(String)}} "
        "ORDER BY trajectory_id, step_index, event_id",
        {"ids": list(trajectory_ids)},
    )


def collect(query: Query, version: str) -> dict[str, Any]:
    """The lineage of `version` as plain data; raises ClickHouseError naming an unknown version."""
    found = query(version_sql(version))
    if not found:
        raise ClickHouseError(
            f"policy version {version!r}: not in {DATABASE}.policy_versions (is the sink running, "
            "and was it published?)"
        )
    row = found[0]
    batches = query(batches_sql(list(row["batch_ids"])))
    trajectory_ids = list(row["trajectory_ids"]) or sorted({t for b in batches for t in b["trajectory_ids"]})
    steps = query(steps_sql(trajectory_ids)) if trajectory_ids else []
    return {
        "version": _version(row),
        "batches": [_batch(b) for b in batches],
        "trajectories": query(trajectories_sql(trajectory_ids)) if trajectory_ids else [],
        "steps_by_policy_version": steps_per_version(steps),
        "steps": steps,
    }


def _version(row: dict) -> dict:
    out = {k: v for k, v in row.items() if k != "source_ranges"}
    out["source_ranges"] = json.loads(row.get("source_ranges") or "{}")
    return out


def _batch(row: dict) -> dict:
    return {**row, "source_offsets": json.loads(row.get("source_offsets") or "{}")}


def steps_per_version(steps: list[dict]) -> dict[str, int]:
    """Step counts per the policy version that produced them ('' for steps no policy recorded).

    >>> steps_per_version([{"policy_version": "v1"}, {"policy_version": None}, {"policy_version": "v1"}])
    {'': 1, 'v1': 2}
    """
    counts = Counter(s.get("policy_version") or "" for s in steps)
    return dict(sorted(counts.items()))


def format_lineage(lineage: dict[str, Any], limit: int = 20) -> str:
    """The lineage as text for a person: the version, its batches, then the step events (first
    `limit`, with the count)."""
    v = lineage["version"]
    lines = [
        f"{v['policy_version']} <- parent {v.get('previous_version') or '(base)'}: {v['method']} "
        f"step {v['step']}, checkpoint {v['checkpoint_path']}",
        "metrics: " + ", ".join(f"{k}={_num(x)}" for k, x in sorted(v["metrics"].items())),
        gate_line(v),
        f"staleness (versions behind -> groups): {dict(v['staleness_histogram']) or '-'}; "
        f"dropped groups: {v['dropped_groups']}",
        f"behaviour versions: {', '.join(v['behaviour_versions']) or '-'}",
        f"source ranges: {json.dumps(v['source_ranges'], sort_keys=True)}",
        "",
        f"batches ({len(v['batch_ids'])}):",
    ]
    known = {b["batch_id"]: b for b in lineage["batches"]}
    for batch_id in v["batch_ids"]:
        b = known.get(batch_id)
        lines.append(
            f"  {batch_id}: {b['kind']}, {b['row_count']} rows, {len(b['trajectory_ids'])} trajectories"
            if b
            else f"  {batch_id}: (no batch.built row)"
        )
    lines += _steps_lines(lineage, limit)
    return "\n".join(lines)


def gate_line(version: dict[str, Any]) -> str:
    """The evaluation gate's decision and figures (`agentstream train --gate`), for a person.

    >>> gate_line({"gate": "refused", "gate_figures": {"serving_version": 1.0, "p_worse": 0.0039}})
    'gate: REFUSED (never served) against v1: p_worse=0.0039, serving_version=1'
    >>> gate_line({"gate": ""}), gate_line({})
    ('gate: - (no gate ran)', 'gate: - (no gate ran)')
    """
    verdict = version.get("gate") or ""
    if not verdict:
        return "gate: - (no gate ran)"
    figures = dict(version.get("gate_figures") or {})
    serving = figures.get("serving_version")
    name = (
        "base" if serving == 0 else f"v{int(serving)}" if serving and serving > 0 else "an unnumbered version"
    )
    against = "" if serving is None else f" against {name}"
    shown = "REFUSED (never served)" if verdict == "refused" else verdict
    return f"gate: {shown}{against}: " + ", ".join(f"{k}={_num(x)}" for k, x in sorted(figures.items()))


def _steps_lines(lineage: dict[str, Any], limit: int) -> list[str]:
    steps = lineage["steps"]
    per = ", ".join(f"{k or '(none)'}: {n}" for k, n in lineage["steps_by_policy_version"].items())
    out = [
        "",
        f"trajectories: {len(lineage['trajectories'])}; step events: {len(steps)} "
        f"(by producing version: {per or '-'})",
    ]
    for s in steps[:limit]:
        out.append(f"  {s['event_id']}  {s['trajectory_id']}#{s['step_index']}  {s['policy_version'] or '-'}")
    if len(steps) > limit:
        out.append(f"  ... {len(steps) - limit} more (--json lists every event id)")
    return out


def _num(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)

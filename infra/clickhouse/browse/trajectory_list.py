"""The trajectory list: one page of trajectories matching a `TrajectoryFilter` (latest revision
each, of one reward version), the count, and the facets the filters offer. Every filter value is
bound as a ClickHouse parameter (`infra.clickhouse.sql.Sql`); `agentstream trajectories` prints the
same page.
"""

from __future__ import annotations

import math
from dataclasses import fields, replace
from typing import Any

from clients.clickhouse import DATABASE as DB
from infra.clickhouse.browse.filters import TrajectoryFilter
from infra.clickhouse.sql import Sql, run, run_dicts
from infra.clickhouse.versions import resolve_reward_version, reward_versions

_WHERE = {
    "domain": ("domain = {domain:String}", "domain"),
    "agent": ("agent = {agent:String}", "agent"),
    "model": ("model = {model:String}", "model"),
    "policy_version": ("ifNull(policy_version, '') = {policy_version:String}", "policy_version"),
    "success": ("success = {success:UInt8}", "success"),
    "reward_min": ("total_reward >= {reward_min:Float64}", "reward_min"),
    "reward_max": ("total_reward <= {reward_max:Float64}", "reward_max"),
    "since": ("coalesce(ended_at, occurred_at) >= {since:DateTime64(3, 'UTC')}", "since"),
    "until": ("coalesce(ended_at, occurred_at) <= {until:DateTime64(3, 'UTC')}", "until"),
    "search": ("positionCaseInsensitiveUTF8(task, {search:String}) > 0", "search"),
    "reward_version": ("reward_version = {reward_version:String}", "reward_version"),
}
LIST_COLUMNS = (
    "trajectory_id, coalesce(ended_at, occurred_at) AS at, task, domain, agent, model, "
    "ifNull(policy_version, '') AS policy_version, success, total_reward, total_steps, complete, missing"
)


def _where(f: TrajectoryFilter) -> tuple[str, dict[str, Any]]:
    clauses, params = [], {}
    for spec in fields(TrajectoryFilter):
        value = getattr(f, spec.name)
        if spec.name in _WHERE and value is not None:
            clause, param = _WHERE[spec.name]
            clauses.append(clause)
            params[param] = int(value) if isinstance(value, bool) else value
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def trajectory_list_sql(f: TrajectoryFilter) -> Sql:
    """One page of trajectories (latest revision each), newest first."""
    where, params = _where(f)
    return Sql(
        f"SELECT {LIST_COLUMNS} FROM {DB}.trajectories FINAL{where} ORDER BY at DESC, trajectory_id "
        "LIMIT {limit:UInt32} OFFSET {offset:UInt64}",
        {**params, "limit": f.page_size, "offset": f.offset},
    )


def trajectory_count_sql(f: TrajectoryFilter) -> Sql:
    where, params = _where(f)
    return Sql(f"SELECT count() FROM {DB}.trajectories FINAL{where}", params)


FACETS_SQL = Sql(
    "SELECT groupUniqArray(200)(domain), groupUniqArray(200)(agent), groupUniqArray(200)(model), "
    f"groupUniqArray(200)(ifNull(policy_version, '')) FROM {DB}.trajectories"
)


def trajectory_page(client, f: TrajectoryFilter) -> dict[str, Any]:
    """`rows` of the page, `total` matching, `pages`, the `facets` the filters offer, and the reward
    version shown (`version`: `f.reward_version`, else the newest complete one; one row per
    trajectory of that version)."""
    known = reward_versions(lambda sql: run(client, sql))
    choice = resolve_reward_version(lambda sql: run(client, sql), f.reward_version)
    shown = replace(f, reward_version=choice.version)
    rows = run_dicts(client, trajectory_list_sql(shown))
    total = int(run(client, trajectory_count_sql(shown))[0][0])
    facet_row = run(client, FACETS_SQL)[0]
    names = ("domain", "agent", "model", "policy_version")
    facets = {name: sorted(v for v in values if v) for name, values in zip(names, facet_row, strict=True)}
    facets["reward_version"] = [k["reward_version"] for k in known]
    pages = max(1, math.ceil(total / f.page_size))
    version = {**choice.as_dict(), "text": choice.describe()}
    return {"rows": rows, "total": total, "pages": pages, "facets": facets, "version": version}

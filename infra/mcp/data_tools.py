"""Tools over the analytics store: `sql`, `leaderboard`, `trajectory`, `build_preferences`,
`export_dataset`. Plain functions of an `McpConfig` and the tool's arguments, returning JSON values.

Each one reuses the query layer the CLI and the console run (infra/clickhouse/): no second copy of
a query. A connection is opened per call and closed after it, so an idle server holds no chDB lock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from clients.clickhouse import DATABASE
from infra.clickhouse.sql import Sql
from infra.mcp.config import McpConfig
from infra.mcp.errors import McpToolError
from infra.mcp.json_trajectory import as_object, score_json_trajectory
from infra.mcp.values import jsonable
from schemas.events import TrajectoryScored


@contextmanager
def clickhouse(config: McpConfig, **kwargs: Any) -> Iterator[Any]:
    """A clickhouse-connect client for the configured URL, closed afterwards: a reader of a served
    chDB path (the engine refuses its writes; clients/clickhouse/endpoint.py)."""
    from clients.clickhouse.client import connect

    client = connect(config.clickhouse_url, wait_s=5.0, **kwargs)
    try:
        yield client
    finally:
        client.close()


def sql(config: McpConfig, query: str) -> dict[str, Any]:
    """One SELECT over the project's tables, as the endpoint's reader, under the row, time and
    memory limits (infra/mcp/readonly.py). Bare table names are the agentstream database's."""
    from infra.mcp.readonly import check_read_only, run_read_only

    check_read_only(query)  # before connecting: an empty or oversized query never reaches the engine
    with clickhouse(config, database=DATABASE) as client:
        return jsonable(run_read_only(client, query, config.sql_max_rows, config.sql_timeout_s))


def leaderboard(
    config: McpConfig, by: str = "model", domain: str | None = None, since: str | None = None
) -> dict[str, Any]:
    """`agentstream leaderboard`'s rows."""
    from infra.clickhouse.analytics import leaderboard_rows
    from infra.clickhouse.sql import run

    with clickhouse(config) as client:
        rows = leaderboard_rows(lambda q: run(client, q), by, domain or None, since or None)
    return {"by": by, "rows": jsonable(rows)}


def trajectory(config: McpConfig, trajectory_id: str, detail: bool = False) -> dict[str, Any]:
    """`agentstream trajectory ID`'s episode and per-step scores, or with `detail` everything the
    console's trajectory page shows (step text, judge verdicts, annotations)."""
    from clients.clickhouse import ClickHouseError
    from infra.clickhouse.browse.trajectory_detail import trajectory_detail, trajectory_scores

    with clickhouse(config) as client:
        if detail:
            found = trajectory_detail(client, trajectory_id)
            if found is None:
                raise ClickHouseError(f"trajectory_id {trajectory_id!r}: no such trajectory in ClickHouse")
            return jsonable(found)
        episode, steps = trajectory_scores(client, trajectory_id)
    return {"episode": jsonable(episode), "steps": jsonable(steps)}


# --- preferences ----------------------------------------------------------------------------------


def scored_from_json(items: list[Any]) -> list[TrajectoryScored]:
    """Trajectories given as JSON: a `trajectory.scored` event is taken as it is, any other
    object is scored by the rule layer first (infra/mcp/json_trajectory.py)."""
    from schemas.codec import validate
    from schemas.errors import DecodeError

    out = []
    for i, item in enumerate(items):
        data = as_object(item, f"trajectories[{i}]")
        if data.get("type") == "trajectory.scored":
            try:
                out.append(validate(data))
            except DecodeError as exc:
                raise McpToolError(f"trajectories[{i}]: {exc}") from None
        else:
            out.append(score_json_trajectory(data, where=f"trajectories[{i}]"))
    return out


def scored_sql(task_id: str | None, limit: int) -> Sql:
    """The newest `trajectory.scored` event of each training trajectory (of one task), as stored.
    Evaluation episodes (`purpose` 'eval', schema 1.5) never become training data, as in
    `agentstream export` (infra/export/sources.py)."""
    where = f"WHERE reward_version = (SELECT reward_version FROM {DATABASE}.reward_version_default)"
    where += " AND purpose = 'train'"
    where += " AND task_id = {task_id:String}" if task_id else ""
    return Sql(
        f"SELECT raw FROM {DATABASE}.events WHERE type = 'trajectory.scored' AND event_id IN "
        f"(SELECT event_id FROM {DATABASE}.trajectories FINAL {where}) "
        "ORDER BY trajectory_id LIMIT 1 BY trajectory_id LIMIT {limit:UInt32}",
        {"task_id": task_id, "limit": limit} if task_id else {"limit": limit},
    )


def scored_from_clickhouse(config: McpConfig, task_id: str | None, limit: int) -> list[TrajectoryScored]:
    from infra.clickhouse.sql import run
    from schemas.codec import decode

    with clickhouse(config) as client:
        rows = run(client, scored_sql(task_id, limit))
    return [decode(raw) for (raw,) in rows]


def build_preferences(
    config: McpConfig,
    trajectories: list[Any] | None = None,
    task_id: str | None = None,
    level: Literal["trajectory", "step"] = "trajectory",
    min_margin: float = 0.05,
    strategy: Literal["best_vs_worst", "all_pairs"] = "best_vs_worst",
    max_pairs: int = 8,
    limit: int = 500,
) -> dict[str, Any]:
    """DPO pairs (consumers/batching/builders/dpo.py) per task among `trajectories` (JSON), or,
    without them, among the scored training trajectories in ClickHouse (of `task_id`, at most
    `limit`). Evaluation episodes (purpose "eval") are never offered: left out of both, and counted
    in `left_out_by_purpose`."""
    from consumers.batching.builders.dpo import DPOPairBuilder, DPOPairConfig, StepPairBuilder
    from consumers.errors import ConsumerConfigError
    from infra.export.rows import one_definition

    try:
        dpo = DPOPairConfig(min_margin=min_margin, strategy=strategy, max_pairs_per_group=max_pairs)
    except ConsumerConfigError as exc:
        raise McpToolError(str(exc)) from None
    if trajectories:
        scored = scored_from_json(trajectories)
    else:
        scored = scored_from_clickhouse(config, task_id, limit)
    training = [t for t in scored if t.purpose == "train"]
    groups: dict[str, list[TrajectoryScored]] = defaultdict(list)
    for t in training:
        if not task_id or t.task_id == task_id:
            groups[t.task_id].append(t)
    builder = StepPairBuilder(dpo) if level == "step" else DPOPairBuilder(dpo)
    # a pair compares two rewards of one definition (docs/reward-definitions.md), as the trainer's do
    pairs = [row for _, group in sorted(groups.items()) for row in builder.build(one_definition(group))]
    return {
        "level": level,
        "trajectories": len(training),
        "left_out_by_purpose": len(scored) - len(training),
        "tasks": len(groups),
        "pairs": jsonable(pairs),
    }


# --- export ---------------------------------------------------------------------------------------


def export_dataset(
    config: McpConfig,
    kind: str = "sft",
    out_dir: str | None = None,
    fmt: str = "jsonl",
    source: str = "clickhouse",
    split: str = "0.8,0.1,0.1",
    seed: int = 0,
    min_reward: float | None = None,
    require_success: bool = True,
) -> dict[str, Any]:
    """`agentstream export` (infra/export/): a dataset split by task into train / validation / test,
    validated after writing. `out_dir` (default `<kind>`) is a relative path under
    `<data dir>/exports/`: absolute paths, `..` and links that lead out are refused, and an
    existing directory is replaced only when it holds nothing but an earlier export's own files."""
    from pathlib import Path

    from infra.export.errors import ExportError
    from infra.export.files import confined
    from infra.export.run import export_dataset as write_dataset

    root = Path(config.data_dir).resolve() / "exports"
    try:
        target = confined(root, kind if out_dir is None else out_dir, "out_dir")
    except ExportError as exc:
        raise McpToolError(str(exc)) from None
    root.mkdir(parents=True, exist_ok=True)
    options = {"data_dir": config.data_dir, "split": split, "seed": seed, "min_reward": min_reward}
    options["require_success"] = require_success
    try:
        if source != "clickhouse":
            return jsonable(write_dataset(None, kind, source, fmt, target, **options))
        with clickhouse(config) as client:
            return jsonable(write_dataset(client, kind, source, fmt, target, **options))
    except ExportError as exc:  # the export names its CLI option; here the argument is out_dir
        raise McpToolError(str(exc).replace("--out:", "out_dir:", 1)) from None

"""Tools over the reward model: `score_trajectory` (rule layer), `list_rubrics`, `annotate` (a human
label, published) and `calibration_report` (judge-to-human agreement, read-only).

Each is the CLI's code path without its printing: labels are built by
`streams.judge.annotations.annotation_event` and published by `streams.judge.human.publish`
(`agentstream annotate`); the report pairs and fits as `agentstream calibrate` does, without
publishing maps.
"""

from __future__ import annotations

from typing import Any, Literal

from infra.mcp.config import McpConfig
from infra.mcp.errors import McpToolError
from infra.mcp.json_trajectory import score_json_trajectory
from infra.mcp.values import jsonable


def score_trajectory(config: McpConfig, trajectory: dict[str, Any] | str) -> dict[str, Any]:
    """The `trajectory.scored` the rule layer, the outcome and efficiency give a JSON trajectory."""
    scored = score_json_trajectory(trajectory)
    body = scored.model_dump(mode="json", exclude={"event_id", "revision", "producer", "schema_version"})
    return jsonable(body)


def list_rubrics(config: McpConfig, domain: str | None = None) -> dict[str, Any]:
    """The built-in rubric catalogue (streams/rubrics.py): per domain, each rubric's id, weight,
    evaluator (rule, model, human) and description; unknown domains resolve to `generic`."""
    from streams.rubrics import BUILTIN_RUBRICS, FALLBACK_DOMAIN

    def rubrics(name: str) -> list[dict[str, Any]]:
        return [
            {"id": r.id, "weight": r.weight, "evaluator": r.evaluator, "description": r.description}
            for r in BUILTIN_RUBRICS[name]
        ]

    if domain:
        resolved = domain if domain in BUILTIN_RUBRICS else FALLBACK_DOMAIN
        return {"domain": domain, "resolved_domain": resolved, "rubrics": rubrics(resolved)}
    return {"domains": {name: rubrics(name) for name in BUILTIN_RUBRICS}, "fallback_domain": FALLBACK_DOMAIN}


def annotate(
    config: McpConfig,
    trajectory_id: str,
    score: float,
    rubric: str = "overall",
    step_index: int | None = None,
    annotator: str = "",
    comment: str = "",
) -> dict[str, Any]:
    """Publish one human label (`feedback.annotation`) to `feedback.human`, as `agentstream annotate`."""
    from schemas.topics import topic_for
    from streams.judge.annotations import annotation_event
    from streams.judge.human import publish

    event = annotation_event(trajectory_id, rubric, score, step_index, annotator, comment)
    try:
        publish(config.bootstrap_servers, [event])
    except Exception as exc:
        if not type(exc).__module__.startswith("kafka"):
            raise
        raise McpToolError(
            f"bootstrap_servers {config.bootstrap_servers!r}: the label was not published "
            f"({type(exc).__name__}: {exc})"
        ) from None
    return {"published": True, "topic": topic_for(event.type), "event": jsonable(event)}


def calibration_report(
    config: McpConfig,
    domain: str | None = None,
    min_pairs: int = 10,
    source: Literal["clickhouse", "topics"] = "clickhouse",
) -> dict[str, Any]:
    """Judge-to-human agreement per (domain, rubric) and the isotonic map each would get, as
    `agentstream calibrate` reports it; nothing is published."""
    from streams.judge.annotations import pair_tables
    from streams.judge.calibration import fit_by_key, report_rows
    from streams.judge.human import read_clickhouse, read_score_tables

    if min_pairs < 2:
        raise McpToolError(f"min_pairs: must be >= 2, got {min_pairs!r}")
    if source == "clickhouse":
        tables = read_clickhouse(config.clickhouse_url)
    else:
        tables = read_score_tables(config.bootstrap_servers, config.read_timeout_s)
    pairs = pair_tables(tables, domain or None)
    results, skipped = fit_by_key(pairs.by_key, min_pairs)
    maps = [{"version": r.map.version, "xs": r.map.xs, "ys": r.map.ys} for r in results]
    return jsonable(
        {"rows": report_rows(results), "maps": maps, "skipped": skipped, "unmatched": pairs.unmatched}
    )

"""The queries behind browsing what ClickHouse knows: the trajectory list and its filters, one
trajectory with every layer, dead letters, and the training tables. The web console
(`infra.console`) and the CLI (`agentstream trajectory`, `trajectories`) run these same builders;
there is no second copy of the SQL.

Every value that comes from a user is bound as a ClickHouse parameter (`infra.clickhouse.sql.Sql`);
filters are parsed into a `TrajectoryFilter` first, and a malformed one raises `FilterError` naming
the field and the value. The functions that run queries take a clickhouse-connect client and return
plain dicts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any

from clients.clickhouse import DATABASE
from infra.clickhouse.analytics import trajectory_sql, trajectory_steps
from infra.clickhouse.sql import Sql, run, run_dicts
from infra.clickhouse.versions import resolve_reward_version, reward_versions, trajectory_version
from infra.errors import FilterError

DB = DATABASE
MAX_PAGE_SIZE = 200
MAX_TEXT = 200
# time filters: within what ClickHouse's Date and DateTime64 both hold (out of it the engine refuses
# the bound value, or saturates it); no event is recorded outside it
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC).replace(tzinfo=None)  # naive UTC, as `_time` returns
LATEST = datetime(2149, 6, 6, tzinfo=UTC).replace(tzinfo=None)
_TRUE = {"true", "1", "yes", "success", "succeeded"}
_FALSE = {"false", "0", "no", "failure", "failed"}


@dataclass(frozen=True)
class TrajectoryFilter:
    """What the trajectory list shows: every field optional, all of them ANDed."""

    domain: str | None = None
    agent: str | None = None
    model: str | None = None
    policy_version: str | None = None
    success: bool | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    since: datetime | None = None
    until: datetime | None = None
    search: str | None = None  # case-insensitive substring of the task
    reward_version: str | None = None  # None: the newest complete version (infra.clickhouse.versions)
    page: int = 1
    page_size: int = 50
    default_page_size: int = field(default=50, compare=False)  # what a URL without page_size gives

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.page_size

    def to_query(self, **changes: Any) -> dict[str, str]:
        """The URL query that gives this filter back (defaults left out), with `changes` applied."""
        values = asdict(replace(self, **changes))
        defaults = {**asdict(TrajectoryFilter()), "page_size": self.default_page_size}
        values.pop("default_page_size")
        return {k: _show(v) for k, v in values.items() if v is not None and v != defaults[k]}


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%S")
    return str(value)


def parse_filter(query: Mapping[str, str], page_size: int = 50) -> TrajectoryFilter:
    """A `TrajectoryFilter` from URL query values; empty values are unset, unknown keys ignored.

    >>> parse_filter({"domain": "code", "success": "false", "reward_min": "0.5"}).success
    False
    >>> parse_filter({"page": "0"})
    Traceback (most recent call last):
    ...
    infra.errors.FilterError: page='0': must be a whole number from 1 to 100000
    """
    given = {k: v.strip() for k, v in query.items() if isinstance(v, str) and v.strip()}
    values: dict[str, Any] = {"page_size": _int(given, "page_size", page_size, 1, MAX_PAGE_SIZE)}
    values["default_page_size"] = page_size
    for name in ("domain", "agent", "model", "policy_version", "search", "reward_version"):
        if name in given:
            values[name] = _text(name, given[name])
    if "success" in given:
        values["success"] = _success(given["success"])
    for name in ("reward_min", "reward_max"):
        if name in given:
            values[name] = _float(name, given[name])
    for name in ("since", "until"):
        if name in given:
            values[name] = _time(name, given[name])
    values["page"] = _int(given, "page", 1, 1, 100_000)
    _check_ranges(values)
    return TrajectoryFilter(**values)


def _text(name: str, value: str) -> str:
    if len(value) > MAX_TEXT:
        raise FilterError(name, value[:40] + "...", f"at most {MAX_TEXT} characters")
    return value


def _success(value: str) -> bool | None:
    lowered = value.lower()
    if lowered in ("any", "all"):
        return None
    if lowered in _TRUE or lowered in _FALSE:
        return lowered in _TRUE
    raise FilterError("success", value, "must be true, false or any")


def _float(name: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise FilterError(name, value, "must be a number, e.g. 0.5") from None
    if not math.isfinite(number):
        raise FilterError(name, value, "must be a finite number")
    return number


def _time(name: str, value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise FilterError(
            name, value, "must be a date or time, e.g. 2026-11-25 or 2026-11-25T14:30"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC).replace(tzinfo=None)
    if not EARLIEST <= moment <= LATEST:
        raise FilterError(name, value, f"must be from {EARLIEST:%Y-%m-%d} to {LATEST:%Y-%m-%d}")
    return moment


def _int(given: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    if name not in given:
        return default
    value = given[name]
    if not value.isdigit() or not low <= int(value) <= high:
        raise FilterError(name, value, f"must be a whole number from {low} to {high}")
    return int(value)


def _check_ranges(values: dict[str, Any]) -> None:
    low, high = values.get("reward_min"), values.get("reward_max")
    if low is not None and high is not None and low > high:
        raise FilterError("reward_min", low, f"is above reward_max={high}")
    since, until = values.get("since"), values.get("until")
    if since is not None and until is not None and since > until:
        raise FilterError("since", _show(since), f"is after until={_show(until)}")


# --- the list --------------------------------------------------------------------------------------

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


# --- one trajectory --------------------------------------------------------------------------------


def trajectory_scores(
    client, trajectory_id: str, reward_version: str | None = None
) -> tuple[dict, list[dict]]:
    """The episode and the per-step scores of `agentstream trajectory ID` (rule, judge, human,
    process) under a reward version (`trajectory_version`: given, else the newest complete one the
    trajectory has); the episode names it (`reward_version`, `reward_version_source`) and every
    version the trajectory has (`reward_versions`). Raises ClickHouseError naming an id that is nowhere."""
    from clients.clickhouse import ClickHouseError

    choice, has = trajectory_version(lambda sql: run(client, sql), trajectory_id, reward_version)
    queries = trajectory_sql(trajectory_id, choice.version)
    results = {name: run(client, sql) for name, sql in queries.items() if name != "episode"}
    episode_rows = run_dicts(client, queries["episode"])
    steps = trajectory_steps(results)
    if not steps and not episode_rows:
        raise ClickHouseError(f"trajectory_id {trajectory_id!r}: no such trajectory in ClickHouse")
    episode = {**(episode_rows[0] if episode_rows else {}), **choice.as_dict(), "reward_versions": has}
    return episode, steps


def trajectory_detail_sql(trajectory_id: str, reward_version: str = "") -> dict[str, Sql]:
    """What the console shows beyond the scores: the scored header (of `reward_version`), the
    episode, every step's text, each judge verdict with its rationale, cost and failure, and the
    human annotations."""
    texts = {
        "header": (
            "SELECT trajectory_id, revision, task_id, task, domain, agent, model, policy_version, group_id, "
            "success, total_steps, outcome_score, process_score, efficiency_score, total_reward, complete, "
            "missing, reward_version, calibration_version, started_at, ended_at "
            f"FROM {DB}.trajectories FINAL "
            "WHERE trajectory_id = {tid:String} AND reward_version = {rv:String}"
        ),
        "episode": (
            "SELECT task_id, task, domain, agent, model, policy_version, success, score, started_at, "
            f"ended_at, total_steps, error FROM {DB}.episodes FINAL WHERE trajectory_id = {{tid:String}}"
        ),
        "steps": (
            "SELECT step_index, thought, tool, params, observation, exit_code, error, model, latency_ms, "
            f"input_tokens, output_tokens, occurred_at FROM {DB}.steps FINAL "
            "WHERE trajectory_id = {tid:String} ORDER BY step_index, occurred_at"
        ),
        "judge": (
            "SELECT kind, step_index, score, scores, rationale, judge_model, prompt_version, cost_usd, "
            "cached, mode, failure_kind, failure_reason, attempts, occurred_at "
            f"FROM {DB}.judge_scores FINAL WHERE trajectory_id = {{tid:String}} ORDER BY occurred_at"
        ),
        "annotations": (
            "SELECT step_index, rubric, score, annotator, comment, occurred_at "
            f"FROM {DB}.annotations FINAL WHERE trajectory_id = {{tid:String}} ORDER BY occurred_at"
        ),
    }
    params = {"tid": trajectory_id, "rv": reward_version}
    return {
        name: Sql(text, {k: v for k, v in params.items() if f"{{{k}:" in text})
        for name, text in texts.items()
    }


def trajectory_detail(client, trajectory_id: str, reward_version: str | None = None) -> dict[str, Any] | None:
    """Everything about one trajectory, step by step; None when ClickHouse has nothing under the id.

    Each step carries its text (thought, tool, params, observation), the scores of
    `trajectory_scores` (the CLI's numbers) and the judge verdicts and annotations on it."""
    choice, has = trajectory_version(lambda sql: run(client, sql), trajectory_id, reward_version)
    queries = trajectory_detail_sql(trajectory_id, choice.version)
    details = {name: run_dicts(client, sql) for name, sql in queries.items()}
    if not any(details[name] for name in ("header", "episode", "steps")):
        return None
    episode, scores = trajectory_scores(client, trajectory_id, choice.version or None)
    return {
        "version": {**choice.as_dict(), "text": choice.describe(), "versions": has},
        "header": merge_header(trajectory_id, details["episode"], [episode], details["header"]),
        "steps": merge_steps(scores, details["steps"], details["judge"], details["annotations"]),
        "trajectory_judgements": [j for j in details["judge"] if j["step_index"] is None],
        "annotations": [a for a in details["annotations"] if a["step_index"] is None],
    }


HEADER_FIELDS = [
    "trajectory_id",
    "task_id",
    "task",
    "domain",
    "agent",
    "model",
    "policy_version",
    "group_id",
    "success",
    "score",
    "total_steps",
    "outcome_score",
    "process_score",
    "efficiency_score",
    "total_reward",
    "complete",
    "missing",
    "reward_version",
    "calibration_version",
    "started_at",
    "ended_at",
    "error",
]


def merge_header(trajectory_id: str, *sources: list[dict]) -> dict[str, Any]:
    """Every field of `HEADER_FIELDS` (None when unknown); later sources win where they have a value.

    >>> merge_header("t", [{"task": "a", "success": None}], [{"success": 1}])["success"]
    1
    """
    header: dict[str, Any] = dict.fromkeys(HEADER_FIELDS)
    header["trajectory_id"] = trajectory_id
    for rows in sources:
        for key, value in (rows[0] if rows else {}).items():
            if key in header and value not in (None, ""):
                header[key] = value
    return header


STEP_TEXT_FIELDS = [
    "step_index",
    "thought",
    "tool",
    "params",
    "observation",
    "exit_code",
    "error",
    "model",
    "latency_ms",
    "input_tokens",
    "output_tokens",
    "occurred_at",
]
STEP_SCORE_FIELDS = [
    "step",
    "tool",
    "exit_code",
    "error",
    "rule",
    "redundancy",
    "regression",
    "info_use",
    "judge",
    "human",
    "process",
]


def merge_steps(scores: list[dict], texts: list[dict], judge: list[dict], notes: list[dict]) -> list[dict]:
    """One dict per step index: its text, its scores and its verdicts (pure). Every step has every
    field; a layer or a text that is absent is None, never left out.

    >>> step = merge_steps([{"step": 0, "rule": 0.5}], [{"step_index": 0, "tool": "bash"}], [], [])[0]
    >>> step["text"]["tool"], step["scores"]["judge"]
    ('bash', None)
    """
    by_text = {}
    for row in texts:  # a step recorded twice under two event ids: the first one shown
        by_text.setdefault(row["step_index"], row)
    by_score = {row["step"]: row for row in scores}
    return [
        {
            "index": i,
            "text": {**dict.fromkeys(STEP_TEXT_FIELDS), **by_text.get(i, {})},
            "scores": {**dict.fromkeys(STEP_SCORE_FIELDS), **by_score.get(i, {})},
            "judgements": [j for j in judge if j["step_index"] == i],
            "annotations": [a for a in notes if a["step_index"] == i],
        }
        for i in sorted(set(by_text) | set(by_score))
    ]


# --- overview, leaderboard extras, training --------------------------------------------------------


def dead_letters_sql(limit: int = 20) -> Sql:
    return Sql(
        "SELECT occurred_at, stage, reason, error_type, source_topic, source_partition, source_offset, "
        f"source_key, trajectory_id, event_id FROM {DB}.dead_letters FINAL "
        "ORDER BY occurred_at DESC, event_id LIMIT {limit:UInt32}",
        {"limit": limit},
    )


COUNTS_SQL = Sql(
    f"SELECT (SELECT count() FROM {DB}.events) AS events, (SELECT count() FROM {DB}.steps) AS steps, "
    f"(SELECT uniqExact(trajectory_id) FROM {DB}.trajectories) AS trajectories, "
    f"(SELECT count() FROM {DB}.dead_letters) AS dead_letters, (SELECT count() FROM {DB}.batches) AS batches"
)


def reward_by_step_sql(domain: str | None = None) -> Sql:
    """Mean rule and judge score by step index, per domain (`agentstream.reward_by_step`)."""
    where = " WHERE domain = {domain:String}" if domain else ""
    return Sql(
        "SELECT domain, step_index, steps, mean_rule_score, mean_judge_score "
        f"FROM {DB}.reward_by_step{where} ORDER BY domain, step_index",
        {"domain": domain} if domain else {},
    )


BATCH_SPAN_SQL = Sql(f"SELECT min(occurred_at), max(occurred_at), count() FROM {DB}.batches")


def batches_over_time_sql(bucket_s: int) -> Sql:
    return Sql(
        "SELECT toStartOfInterval(occurred_at, toIntervalSecond({bucket:UInt32})) AS t, kind, "
        f"count() AS batches, sum(row_count) AS rows FROM {DB}.batches FINAL GROUP BY t, kind ORDER BY t",
        {"bucket": bucket_s},
    )


RECENT_BATCHES_SQL = Sql(
    "SELECT batch_id, occurred_at, kind, row_count, length(trajectory_ids) AS trajectories, "
    f"reward_versions, policy_versions FROM {DB}.batches FINAL ORDER BY occurred_at DESC LIMIT 20"
)
POLICY_VERSIONS_SQL = Sql(
    "SELECT policy_version, previous_version, occurred_at, method, step, length(batch_ids) AS batches, "
    "length(trajectory_ids) AS trajectories, loss, kl, ess, clipped_fraction, metrics "
    f"FROM {DB}.policy_versions FINAL ORDER BY occurred_at"
)
LEARNING_CURVE_SQL = Sql(
    "SELECT policy_version, episodes, judged, success_rate, mean_total_reward, first_seen "
    f"FROM {DB}.policy_version_stats ORDER BY first_seen"
)


def bucket_seconds(first: datetime | None, last: datetime | None, buckets: int = 40) -> int:
    """A bucket width that cuts the span into about `buckets` pieces (at least a second).

    >>> bucket_seconds(datetime(2026, 1, 1), datetime(2026, 1, 1, 1))
    90
    """
    if first is None or last is None:
        return 60
    return max(1, math.ceil((last - first).total_seconds() / buckets))


def training(client) -> dict[str, Any]:
    """Batches by kind over time, the latest batches, policy versions and the learning curve."""
    first, last, count = run(client, BATCH_SPAN_SQL)[0]
    bucket = bucket_seconds(first, last) if count else 60
    return {
        "bucket_s": bucket,
        "batches_over_time": run_dicts(client, batches_over_time_sql(bucket)) if count else [],
        "recent_batches": run_dicts(client, RECENT_BATCHES_SQL),
        "versions": run_dicts(client, POLICY_VERSIONS_SQL),
        "learning_curve": run_dicts(client, LEARNING_CURVE_SQL),
    }

"""Leaderboard and trajectory maths over rows fetched by SQL. Pure functions plus SQL builders.

The leaderboard compares groups (model, agent or policy version) within each domain:
- success rate and mean reward per group, over finished episodes (`agentstream.episode_outcomes`);
- a 95% percentile-bootstrap confidence interval of the mean reward (fixed seed, 2000 resamples);
- Welch's t-test (scipy `ttest_ind(equal_var=False)`) of each group's rewards against the best group
  of its domain (highest mean reward), with Holm's step-down correction over the comparisons of that
  domain (`p_holm`); `significant` means p_holm < 0.05.

Callers pass `query(sql) -> list[tuple]` (sql: an `infra.clickhouse.sql.Sql`, values bound
server-side), so this module never opens a connection itself. The console runs these same builders.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from clients.clickhouse import DATABASE, ClickHouseError
from infra.clickhouse.sql import Sql
from infra.clickhouse.versions import VersionChoice, resolve_reward_version
from schemas.versions import rules_version_of

Query = Callable[[Sql], Sequence[tuple]]
BY_CHOICES = ("model", "agent", "policy_version")
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20260101
ALPHA = 0.05


def quote(value: str) -> str:
    """A ClickHouse string literal.

    >>> quote("it's")
    "'it\\\\'s'"
    """
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def episode_rewards_sql(
    by: str = "model",
    domain: str | None = None,
    since: date | str | None = None,
    reward_version: str | None = None,
) -> Sql:
    """SQL for one row per finished episode: (domain, group, success, reward), the reward under
    `reward_version` (None: the newest complete version, `agentstream.episode_outcomes`)."""
    if by not in BY_CHOICES:
        raise ClickHouseError(f"by={by!r}: must be one of {', '.join(BY_CHOICES)}")
    where, params = ["success IS NOT NULL"], {}
    if domain:
        where.append("domain = {domain:String}")
        params["domain"] = domain
    if since:
        where.append("day >= toDate({since:String})")
        params["since"] = str(since)
    source = f"{DATABASE}.episode_outcomes"
    if reward_version is not None:
        source = f"{DATABASE}.episode_outcomes_at(reward_version = {{reward_version:String}})"
        params["reward_version"] = reward_version
    return Sql(
        f"SELECT domain, {by}, success, reward FROM {source} "
        f"WHERE {' AND '.join(where)} ORDER BY domain, {by}, trajectory_id",
        params,
    )


def bootstrap_ci(
    values: Sequence[float],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile-bootstrap CI of the mean; (nan, nan) without values.

    >>> bootstrap_ci([1.0, 1.0, 1.0])
    (1.0, 1.0)
    """
    import numpy as np

    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return (float(low), float(high))


def welch_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided Welch t-test p-value; nan when either side has < 2 values or no variance at all."""
    import warnings

    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return math.nan
    with warnings.catch_warnings():
        # Near-identical samples: scipy warns about precision; the p-value it returns is still right.
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.ttest_ind(a, b, equal_var=False)
    p = float(result.pvalue)
    return p if math.isfinite(p) else math.nan


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values (nan stays nan and is not counted).

    >>> [round(p, 3) for p in holm([0.01, 0.04, 0.03])]
    [0.03, 0.06, 0.06]
    """
    indexed = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    m = len(indexed)
    adjusted = [math.nan] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


@dataclass
class Group:
    domain: str
    key: str
    successes: list[int]
    rewards: list[float]

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else math.nan


def group_rows(rows: Sequence[tuple]) -> list[Group]:
    """Group (domain, key, success, reward) rows; reward None is 'not scored' and left out."""
    groups: dict[tuple[str, str], Group] = {}
    for domain, key, success, reward in rows:
        group = groups.setdefault((domain, key or ""), Group(domain, key or "", [], []))
        group.successes.append(int(success))
        if reward is not None and not (isinstance(reward, float) and math.isnan(reward)):
            group.rewards.append(float(reward))
    return list(groups.values())


def leaderboard(rows: Sequence[tuple], by: str = "model", resamples: int = BOOTSTRAP_RESAMPLES) -> list[dict]:
    """Leaderboard dicts from (domain, key, success, reward) rows, best first within each domain."""
    out: list[dict] = []
    by_domain: dict[str, list[Group]] = {}
    for group in group_rows(rows):
        by_domain.setdefault(group.domain, []).append(group)
    for domain in sorted(by_domain):
        out += _domain_rows(domain, by_domain[domain], by, resamples)
    return out


def _rank_key(group: Group) -> tuple:
    mean = group.mean_reward
    success = sum(group.successes) / len(group.successes)
    return (-(mean if not math.isnan(mean) else -math.inf), -success, group.key)


def _domain_rows(domain: str, groups: list[Group], by: str, resamples: int) -> list[dict]:
    ranked = sorted(groups, key=_rank_key)
    best = ranked[0]
    raw_p = [math.nan if g is best else welch_p(g.rewards, best.rewards) for g in ranked]
    adjusted = holm(raw_p)
    rows = []
    for group, p, p_adj in zip(ranked, raw_p, adjusted, strict=True):
        low, high = bootstrap_ci(group.rewards, resamples=resamples)
        rows.append(
            {
                "domain": domain,
                by: group.key,
                "episodes": len(group.successes),
                "success_rate": sum(group.successes) / len(group.successes),
                "scored": len(group.rewards),
                "mean_reward": group.mean_reward,
                "ci95_low": low,
                "ci95_high": high,
                "p_vs_best_welch": p,
                "p_holm": p_adj,
                "significant": "best" if group is best else ("yes" if p_adj < ALPHA else "no"),
            }
        )
    return rows


def leaderboard_rows(query: Query, *args: Any, **kwargs: Any) -> list[dict]:
    """The rows of `leaderboard_report` (same arguments): per-episode rewards fetched with SQL, the
    leaderboard computed in Python; each row names the reward version it shows."""
    return leaderboard_report(query, *args, **kwargs)[1]


def leaderboard_report(
    query: Query,
    by: str = "model",
    domain: str | None = None,
    since: date | str | None = None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    reward_version: str | None = None,
) -> tuple[VersionChoice, list[dict]]:
    """The reward version shown (`infra.clickhouse.versions`) and the leaderboard under it."""
    choice = resolve_reward_version(query, reward_version)
    rows = leaderboard(
        query(episode_rewards_sql(by, domain, since, choice.version)), by=by, resamples=resamples
    )
    return choice, [{**row, "reward_version": choice.version} for row in rows]


# --- one trajectory, step by step -----------------------------------------------------------------


def trajectory_sql(trajectory_id: str, reward_version: str | None = None) -> dict[str, Sql]:
    """The queries behind `agentstream trajectory ID` (every layer, deduplicated), under
    `reward_version` (its rule rewards and trajectory row; None: the newest complete version)."""
    db = DATABASE
    episodes = f"{db}.episode_outcomes"
    params: dict[str, object] = {"tid": trajectory_id}
    rules = version = ""
    if reward_version is not None:
        episodes = f"{db}.episode_outcomes_at(reward_version = {{rv:String}})"
        rules = " AND ({rules:String} = '' OR reward_version = {rules:String})"
        version = " AND reward_version = {rv:String}"
        params |= {"rv": reward_version, "rules": rules_version_of(reward_version)}
    texts = {
        "episode": (
            "SELECT trajectory_id, domain, agent, model, policy_version, task_id, success, score, reward, "
            "total_reward, outcome_score, process_score, efficiency_score, total_steps "
            f"FROM {episodes} WHERE trajectory_id = {{tid:String}}"
        ),
        "steps": (
            "SELECT step_index, tool, exit_code, error, left(observation, 60) AS observation "
            f"FROM {db}.steps FINAL WHERE trajectory_id = {{tid:String}} ORDER BY step_index"
        ),
        "rule": (
            "SELECT step_index, argMax(score, occurred_at), argMax(redundancy, occurred_at), "
            "argMax(regression, occurred_at), argMax(info_utilization, occurred_at) "
            f"FROM {db}.rule_rewards FINAL WHERE trajectory_id = {{tid:String}}{rules} GROUP BY step_index"
        ),
        "judge": (
            f"SELECT step_index, argMax(score, occurred_at) FROM {db}.judge_scores FINAL "
            "WHERE trajectory_id = {tid:String} AND kind = 'step' GROUP BY step_index"
        ),
        "human": (
            f"SELECT step_index, avg(score) FROM {db}.annotations FINAL "
            "WHERE trajectory_id = {tid:String} AND step_index IS NOT NULL GROUP BY step_index"
        ),
        "process": (
            f"SELECT step_process_scores FROM {db}.trajectories FINAL WHERE trajectory_id = {{tid:String}}"
            + (version or " ORDER BY ingested_at DESC LIMIT 1")
        ),
    }
    return {
        name: Sql(text, {k: v for k, v in params.items() if "{" + k + ":" in text})
        for name, text in texts.items()
    }


def trajectory_steps(results: dict[str, Sequence[tuple]]) -> list[dict]:
    """Join the per-layer results of `trajectory_sql` into one row per step (None = layer absent)."""
    rule = {r[0]: r[1:] for r in results.get("rule", ())}
    judge = {r[0]: r[1] for r in results.get("judge", ())}
    human = {r[0]: r[1] for r in results.get("human", ())}
    process_rows = results.get("process", ())
    process = list(process_rows[0][0]) if process_rows else []
    indices = sorted({r[0] for r in results.get("steps", ())} | set(rule) | set(judge) | set(human))
    steps = {r[0]: r for r in results.get("steps", ())}
    rows = []
    for i in indices:
        step = steps.get(i, (i, None, None, None, None))
        r = rule.get(i, (None, None, None, None))
        rows.append(
            {
                "step": i,
                "tool": step[1],
                "exit_code": step[2],
                "error": step[3],
                "rule": r[0],
                "redundancy": r[1],
                "regression": r[2],
                "info_use": r[3],
                "judge": judge.get(i),
                "human": human.get(i),
                "process": process[i] if i < len(process) else None,
                "observation": step[4],
            }
        )
    return rows

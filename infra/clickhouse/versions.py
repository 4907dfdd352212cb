"""Which reward version a reader shows (issue #17, docs/reward-versions.md).

`agentstream.trajectories` keeps one row per (trajectory, reward version): the live assembler stamps
`assembly-1+rules-1`, a replay under `rules-2` adds `assembly-1+rules-2` beside it. Every reader
(the leaderboard, `agentstream trajectory` / `trajectories`, the console) shows one version:

- `--reward-version V` given: the trajectory version `V`, or the one whose rules part is `V`
  (`rules-2` selects `assembly-1+rules-2`); a `V` with no trajectories is an error naming it.
- otherwise the **newest complete** version (`agentstream.reward_version_default`, migration 0009):
  the version of the latest completed replay (`reward.version.completed` -> `reward_versions`) that
  has trajectories in ClickHouse, else the live version (the first one written).

The rule is written once, in SQL (the views use it too); this module asks for it and describes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from clients.clickhouse import DATABASE
from infra.clickhouse.sql import Sql
from infra.errors import FilterError
from schemas.versions import rules_version_of

Query = Callable[[Sql], Sequence[tuple]]
VERSION_COLUMNS = (
    "reward_version",
    "rules_version",
    "trajectories",
    "first_seen",
    "last_seen",
    "completed_at",
    "replay_roles",
    "live",
    "complete",
)
VERSIONS_SQL = Sql(
    f"SELECT {', '.join(VERSION_COLUMNS)} FROM {DATABASE}.trajectory_versions "
    "ORDER BY first_seen, reward_version"
)
DEFAULT_SQL = Sql(f"SELECT reward_version FROM {DATABASE}.reward_version_default")


@dataclass(frozen=True)
class VersionChoice:
    """The version a reader shows and why (`how`: given, newest completed replay, live, none)."""

    version: str
    how: str
    completed_at: datetime | None = None

    @property
    def rules_version(self) -> str:
        return rules_version_of(self.version)

    def describe(self) -> str:
        """One line for a CLI header or a page.

        >>> VersionChoice("assembly-1+rules-1", "live").describe()
        'reward version: assembly-1+rules-1 (newest complete: the live version)'
        >>> VersionChoice("", "none").describe()
        'reward version: none (no scored trajectories yet)'
        """
        if self.how == "none":
            return "reward version: none (no scored trajectories yet)"
        name = self.version or "'' (unversioned)"
        if self.how == "newest completed replay":
            when = self.completed_at.strftime("%Y-%m-%d %H:%M:%S UTC") if self.completed_at else "?"
            return (
                f"reward version: {name} (newest complete: replay of {self.rules_version} completed {when})"
            )
        why = {"given": "--reward-version", "live": "newest complete: the live version"}.get(
            self.how, self.how
        )
        return f"reward version: {name} ({why})"

    def as_dict(self) -> dict[str, Any]:
        return {"reward_version": self.version, "reward_version_source": self.how}


def reward_versions(query: Query) -> list[dict[str, Any]]:
    """Every version in `trajectories`, first written first (`agentstream.trajectory_versions`)."""
    return [dict(zip(VERSION_COLUMNS, row, strict=True)) for row in query(VERSIONS_SQL)]


def choose(known: list[dict[str, Any]], requested: str | None, default: str) -> VersionChoice:
    """The choice among `known` versions (rows of `reward_versions`) for `requested`, else `default`
    (the view's newest complete). Pure.

    >>> known = [{"reward_version": "assembly-1+rules-1", "rules_version": "rules-1", "live": 1,
    ...           "completed_at": None, "complete": 1}]
    >>> choose(known, "rules-1", "assembly-1+rules-1")
    VersionChoice(version='assembly-1+rules-1', how='given', completed_at=None)
    >>> choose(known, "rules-9", "")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    infra.errors.FilterError: reward_version='rules-9': no trajectories under it ... (known: ...)
    """
    names = [k["reward_version"] for k in known]
    if requested:
        matches = [n for n in names if n == requested] or [
            n for n in names if rules_version_of(n) == requested
        ]
        if len(matches) != 1:
            why = "no trajectories under it in ClickHouse" if not matches else "matches several versions"
            raise FilterError("reward_version", requested, f"{why} (known: {', '.join(names) or 'none'})")
        return VersionChoice(matches[0], "given")
    row = next((k for k in known if k["reward_version"] == default), None)
    if row is None:
        return VersionChoice("", "none")
    if row["completed_at"] is not None:
        return VersionChoice(default, "newest completed replay", row["completed_at"])
    return VersionChoice(default, "live")


def resolve_reward_version(query: Query, requested: str | None = None) -> VersionChoice:
    """`--reward-version` resolved against ClickHouse: the given version, else the newest complete."""
    default = str(query(DEFAULT_SQL)[0][0])
    return choose(reward_versions(query), (requested or "").strip() or None, default)


def trajectory_version(
    query: Query, trajectory_id: str, requested: str | None = None
) -> tuple[VersionChoice, list[str]]:
    """The version to show one trajectory under, and every version it has. Given: that version
    (it need not have it). Default: the newest complete one when the trajectory has it, else its
    live version, else the version written last for it (a trajectory scored after a replay's end
    offsets only has the live version)."""
    choice = resolve_reward_version(query, requested)
    sql = Sql(
        f"SELECT toString(reward_version), max(ingested_at) AS at FROM {DATABASE}.trajectories "
        "WHERE trajectory_id = {tid:String} GROUP BY reward_version ORDER BY at",
        {"tid": trajectory_id},
    )
    has = [str(row[0]) for row in query(sql)]
    if requested or not has or choice.version in has:
        return choice, has
    live = [k["reward_version"] for k in reward_versions(query) if k["live"]]
    fallback = next((v for v in has if v in live), has[-1])
    return VersionChoice(fallback, "live" if fallback in live else "only version of this trajectory"), has

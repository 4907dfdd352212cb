"""The stream worker's settings: one documented field per option (`agentstream worker` is generated
from `WorkerConfig`; adding a worker option is adding a field here).

Read once by the CLI and passed down; nothing here reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clients.fetch_pacing import IDLE_WAIT_HELP, IDLE_WAIT_MS
from schemas.config_fields import check_bounds, option
from schemas.settings import DEFAULT_BOOTSTRAP
from schemas.topics import AGENT_EVENTS, TOPICS
from streams.errors import WorkerConfigError

ROLES = ("scoring", "judge")
DEFAULT_ROLES = ("scoring",)
# Roles of earlier releases, merged into `scoring` (rule rewards and assembly in one consumer): named
# in the refusal so a deployment still asking for them is told what to run instead.
MERGED_ROLES: dict[str, str] = {"rules": "scoring", "assembler": "scoring"}
# A role exits with this code to be consumed again from its committed offsets (a batch failed, or
# records were never received); `agentstream worker` restarts it, other codes stop the worker.
EXIT_REPLAY = 70


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a stream worker needs, read once from the command line / environment."""

    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    data_dir: Path = Path(".agentstream")
    roles: tuple[str, ...] = option(
        DEFAULT_ROLES,
        "comma-separated roles, one faust app and consumer group each: scoring (rule rewards and "
        "trajectory assembly, reading agent.events once) and judge (the LLM judge)",
    )
    profiles_path: Path | None = option(
        None,
        "JSON/YAML file with extra or overriding domain profiles",
        flag="--profiles",
        env="AGENTSTREAM_PROFILES",
    )
    judge_rules_path: Path | None = option(
        None,
        "judge rules file: trajectories it selects wait for judge scores in scoring",
        flag="--judge-rules",
        env="AGENTSTREAM_JUDGE_RULES_PATH",
    )
    expect_judge: bool = option(
        False,
        "scoring: a judge runs beside it, so without --judge-rules the judge's default rule (every "
        "trajectory, judged as a whole) says what to wait for (set by `up --judge` and "
        "`worker --roles ...,judge`)",
        env="AGENTSTREAM_EXPECT_JUDGE",
    )
    grace_seconds: float = option(
        120.0,
        "scoring: after this long without new input, emit what is there (expected judge results "
        "still missing are given up: docs/reward-definitions.md)",
        gt=0,
    )
    batch_max: int = option(10_000, "events taken from the stream per batch", ge=1)
    batch_within_s: float = option(
        0.1,
        "judge: seconds to wait to fill a batch (scoring takes each fetch)",
        flag="--batch-within",
        env="AGENTSTREAM_BATCH_WITHIN",
        gt=0,
    )
    batch_pace_ms: float = option(
        60.0,
        "scoring: under load, take a batch at most this often (ms), so batches grow instead "
        "of multiplying; the pace follows the event rate, from none at 400 events/s to this at "
        "1,200/s (0: take each fetch as it comes)",
        ge=0,
    )
    fetch_min_bytes: int = option(
        64 * 1024,
        "scoring: a fetch (= a batch) waits for this many bytes, or --fetch-max-wait-ms",
        ge=1,
    )
    fetch_max_wait_ms: int = option(
        25,
        "scoring: longest a fetch waits for --fetch-min-bytes",
        env="AGENTSTREAM_WORKER_FETCH_MAX_WAIT_MS",
        ge=0,
    )
    fetch_idle_wait_ms: int = option(IDLE_WAIT_MS, "scoring: " + IDLE_WAIT_HELP, ge=0)
    reward_version: str = option(
        "rules-1",
        "version stamped on rule rewards and on the trajectories assembled from them (assembly-1+<it>)",
    )
    timer_interval_s: float = 1.0
    session_timeout_s: float = 10.0  # a killed worker's partitions move on after this long
    partitions: int = TOPICS[AGENT_EVENTS].partitions  # of the source topics = of the state tables
    app_prefix: str = option(
        "agentstream",
        "prefix of each role's app id = consumer group and state topics (`<prefix>-<role>`); "
        "`agentstream replay` runs roles under a fresh one",
    )
    ledger_prefix: str = option(
        "agentstream-judge",  # = streams.judge.ledger.LEDGER_PREFIX, the live judge's app id
        "judge: the shared spend budget and reply cache are the topics `<prefix>-budget` and "
        "`<prefix>-cache`, whatever the app prefix, so every judge of a deployment (replicas, "
        "restarts, `agentstream replay --roles judge`) shares them (docs/judge-cost.md)",
    )
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        check_roles(self.roles)
        check_bounds(self, WorkerConfigError)

    def app_id(self, role: str) -> str:
        return f"{self.app_prefix}-{role}"


def check_roles(
    roles: tuple[str, ...], known: tuple[str, ...] = ROLES, listed: str = "roles"
) -> tuple[str, ...]:
    """`--roles`, checked: at least one, each in `known` (named as `listed` in the refusal; `agentstream
    replay` passes its replayable roles). A role of an earlier release is refused saying what to run.

    >>> check_roles(("scoring", "judge"))
    ('scoring', 'judge')
    >>> check_roles(("rules", "assembler"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    streams.errors.WorkerConfigError: --roles: 'rules' is no longer a role: ... one role, --roles scoring ...
    """
    names = ", ".join(known)
    for role in roles:
        if role in MERGED_ROLES:
            raise WorkerConfigError(
                f"--roles: {role!r} is no longer a role: the rule rewards and the assembler run as "
                f"one role, --roles {MERGED_ROLES[role]} ({listed}: {names})"
            )
        if role not in known:
            raise WorkerConfigError(f"--roles: unknown role {role!r} ({listed}: {names})")
    if not roles:
        raise WorkerConfigError(f"--roles: name at least one role ({listed}: {names})")
    return roles

"""The stream worker's settings: one documented field per option (`agentstream worker` is generated
from `WorkerConfig`; adding a worker option is adding a field here).

Read once by the CLI and passed down; nothing here reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clients.fetch_pacing import IDLE_WAIT_MS
from schemas.settings import DEFAULT_BOOTSTRAP
from schemas.topics import AGENT_EVENTS, TOPICS
from streams.errors import WorkerConfigError

ROLES = ("rules", "assembler", "judge", "scoring")
DEFAULT_ROLES = ("scoring",)
# A role exits with this code to be consumed again from its committed offsets (a batch failed, or
# records were never received); `agentstream worker` restarts it, other codes stop the worker.
EXIT_REPLAY = 70


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a stream worker needs, read once from the command line / environment."""

    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    data_dir: Path = Path(".agentstream")
    roles: tuple[str, ...] = field(
        default=DEFAULT_ROLES,
        metadata={
            "help": "comma-separated roles, one faust app and consumer group each: scoring (rule rewards "
            "and trajectory assembly in one, reading agent.events once), or rules and assembler apart; judge"
        },
    )
    profiles_path: Path | None = field(
        default=None,
        metadata={
            "flag": "--profiles",
            "env": "AGENTSTREAM_PROFILES",
            "help": "JSON/YAML file with extra or overriding domain profiles",
        },
    )
    judge_rules_path: Path | None = field(
        default=None,
        metadata={
            "flag": "--judge-rules",
            "env": "AGENTSTREAM_JUDGE_RULES_PATH",
            "help": "judge rules file: trajectories it selects wait for judge scores in the assembler",
        },
    )
    expect_judge: bool = field(
        default=False,
        metadata={
            "env": "AGENTSTREAM_EXPECT_JUDGE",
            "help": "assembler: a judge runs beside it, so without --judge-rules the judge's default rule "
            "(every trajectory, judged as a whole) says what to wait for (set by `up --judge` and "
            "`worker --roles ...,judge`)",
        },
    )
    grace_seconds: float = field(
        default=120.0,
        metadata={
            "help": "assembler: after this long without new input, emit what is there (expected judge "
            "results still missing are given up: docs/reward-definitions.md)"
        },
    )
    batch_max: int = field(default=10_000, metadata={"help": "events taken from the stream per batch"})
    batch_within_s: float = field(
        default=0.1,
        metadata={
            "flag": "--batch-within",
            "env": "AGENTSTREAM_BATCH_WITHIN",
            "help": "judge: seconds to wait to fill a batch (rules and assembler take each fetch)",
        },
    )
    batch_pace_ms: float = field(
        default=60.0,
        metadata={
            "help": "rules/assembler: under load, take a batch at most this often (ms), so batches grow "
            "instead of multiplying; the pace follows the event rate, from none at 400 events/s to "
            "this at 1,200/s (0: take each fetch as it comes)"
        },
    )
    fetch_min_bytes: int = field(
        default=64 * 1024,
        metadata={
            "help": "rules/assembler: a fetch (= a batch) waits for this many bytes, or --fetch-max-wait-ms"
        },
    )
    fetch_max_wait_ms: int = field(
        default=25,
        metadata={
            "env": "AGENTSTREAM_WORKER_FETCH_MAX_WAIT_MS",
            "help": "rules/assembler: longest a fetch waits for --fetch-min-bytes",
        },
    )
    fetch_idle_wait_ms: int = field(
        default=IDLE_WAIT_MS,
        metadata={
            "help": "rules/assembler: once fetches have returned nothing for 250 ms, the next one waits "
            "for the first byte, up to this long, instead of polling every --fetch-max-wait-ms "
            "(0: always as sized)"
        },
    )
    reward_version: str = field(
        default="rules-1",
        metadata={
            "help": "version stamped on rule rewards; the assembler takes only rule rewards of this version"
        },
    )
    timer_interval_s: float = 1.0
    session_timeout_s: float = 10.0  # a killed worker's partitions move on after this long
    partitions: int = TOPICS[AGENT_EVENTS].partitions  # of the source topics = of the state tables
    app_prefix: str = field(
        default="agentstream",
        metadata={
            "help": "prefix of each role's app id = consumer group and state topics (`<prefix>-<role>`); "
            "`agentstream replay` runs roles under a fresh one"
        },
    )
    ledger_prefix: str = field(
        default="agentstream-judge",  # = streams.judge.ledger.LEDGER_PREFIX, the live judge's app id
        metadata={
            "help": "judge: the shared spend budget and reply cache are the topics `<prefix>-budget` and "
            "`<prefix>-cache`, whatever the app prefix, so every judge of a deployment (replicas, "
            "restarts, `agentstream replay --roles judge`) shares them (docs/judge-cost.md)"
        },
    )
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        unknown = [r for r in self.roles if r not in ROLES]
        if unknown or not self.roles:
            raise WorkerConfigError(
                f"--roles: unknown role(s) {unknown or self.roles!r} (known: {list(ROLES)})"
            )
        if self.grace_seconds <= 0:
            raise WorkerConfigError(f"--grace-seconds: must be > 0, got {self.grace_seconds!r}")
        if self.fetch_min_bytes < 1 or self.fetch_max_wait_ms < 0:
            raise WorkerConfigError(
                "--fetch-min-bytes / --fetch-max-wait-ms: must be >= 1 / >= 0, "
                f"got {self.fetch_min_bytes!r} / {self.fetch_max_wait_ms!r}"
            )
        if self.fetch_idle_wait_ms < 0:
            raise WorkerConfigError(f"--fetch-idle-wait-ms: must be >= 0, got {self.fetch_idle_wait_ms!r}")
        if self.batch_pace_ms < 0:
            raise WorkerConfigError(f"--batch-pace-ms: must be >= 0, got {self.batch_pace_ms!r}")
        if self.batch_max < 1 or self.batch_within_s <= 0:
            raise WorkerConfigError(
                "--batch-max / --batch-within: must be positive, "
                f"got {self.batch_max!r} / {self.batch_within_s!r}"
            )

    def app_id(self, role: str) -> str:
        return f"{self.app_prefix}-{role}"

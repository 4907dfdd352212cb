"""The faust app factory: `create_app(config)` builds the app of ONE processor role.

Each role is one faust app whose id is `agentstream-<role>`, so its consumer group, its tables
(`agentstream-<role>-state-changelog`) and its log lines all carry the processor's stable name.
`agentstream worker --roles rules,assembler` runs one such app per role (streams/worker.py).

Settings are read once, by the CLI, into a `WorkerConfig` that is passed down; nothing here reads the
environment. faust is imported inside `create_app` so `agentstream --help` stays fast.

Roles:
- `rules` and `assembler`: streams/agents.py.
- `judge`: `streams.judge.agent:register_judge_agents(app, config)` (owned by the judge package;
  it reads its own `AGENTSTREAM_JUDGE_*` settings).
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.errors import AgentstreamError
from schemas.topics import AGENT_EVENTS, TOPICS

log = logging.getLogger(__name__)

ROLE_REGISTRARS = {
    "rules": "streams.agents:register_rules",
    "assembler": "streams.agents:register_assembler",
    "judge": "streams.judge.agent:register_judge_agents",
}
DEFAULT_ROLES = ("rules", "assembler")
# A role exits with this code to be consumed again from its committed offsets (a batch failed, or
# records were never received); `agentstream worker` restarts it, other codes stop the worker.
EXIT_REPLAY = 70


class WorkerConfigError(AgentstreamError):
    """A worker option is invalid."""


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a stream worker needs, read once from the command line / environment."""

    bootstrap_servers: str
    data_dir: Path = Path(".agentstream")
    roles: tuple[str, ...] = DEFAULT_ROLES
    profiles_path: Path | None = None
    judge_rules_path: Path | None = None
    grace_seconds: float = 120.0
    batch_max: int = 10_000
    batch_within_s: float = 0.1
    timer_interval_s: float = 1.0
    session_timeout_s: float = 10.0  # a killed worker's partitions move on after this long
    partitions: int = TOPICS[AGENT_EVENTS].partitions  # of the source topics = of the state tables
    reward_version: str = "rules-1"
    app_prefix: str = "agentstream"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        unknown = [r for r in self.roles if r not in ROLE_REGISTRARS]
        if unknown or not self.roles:
            raise WorkerConfigError(
                f"--roles: unknown role(s) {unknown or self.roles!r} (known: {sorted(ROLE_REGISTRARS)})"
            )
        if self.grace_seconds <= 0:
            raise WorkerConfigError(f"--grace-seconds: must be > 0, got {self.grace_seconds!r}")
        if self.batch_max < 1 or self.batch_within_s <= 0:
            raise WorkerConfigError(
                "--batch-max / --batch-within: must be positive, "
                f"got {self.batch_max!r} / {self.batch_within_s!r}"
            )

    def app_id(self, role: str) -> str:
        return f"{self.app_prefix}-{role}"


def import_faust():
    """Import faust with our fixes for its recovery race applied (streams/faust_fixes.py)."""
    import faust

    from streams import faust_fixes

    faust_fixes.apply(faust)
    return faust


def _broker_urls(bootstrap: str) -> list[str]:
    return [f"kafka://{host.strip()}" for host in bootstrap.split(",") if host.strip()]


def create_app(config: WorkerConfig, role: str):
    """A faust app running the processor `role` (its agents, tables and timers registered)."""
    faust = import_faust()

    if role not in ROLE_REGISTRARS:
        raise WorkerConfigError(f"role {role!r} is not one of {sorted(ROLE_REGISTRARS)}")
    app_id = config.app_id(role)
    datadir = Path(config.data_dir) / "faust" / app_id
    datadir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        app_id,
        broker=_broker_urls(config.bootstrap_servers),
        datadir=str(datadir),
        store="memory://",
        key_serializer="raw",
        value_serializer="raw",  # tables hold orjson bytes; topics are decoded by schemas.codec
        web_enabled=False,
        topic_replication_factor=1,
        topic_partitions=config.partitions,
        producer_acks=-1,
        producer_max_batch_size=512 * 1024,
        producer_linger=0.005,
        broker_commit_interval=1.0,
        broker_session_timeout=config.session_timeout_s,
        broker_heartbeat_interval=max(0.5, config.session_timeout_s / 5),
        consumer_auto_offset_reset="earliest",
        stream_buffer_maxsize=max(4096, config.batch_max * 2),
        broker_max_poll_records=max(500, config.batch_max),
        table_standby_replicas=0,
        stream_wait_empty=False,
        stream_recovery_delay=0.0,
    )
    module_name, func_name = ROLE_REGISTRARS[role].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise WorkerConfigError(
            f"role {role!r} needs module {module_name!r}, which is not available: {exc}"
        ) from None
    getattr(module, func_name)(app, config)
    log.info("%s: app %s ready (broker %s)", role, app_id, config.bootstrap_servers)
    return app

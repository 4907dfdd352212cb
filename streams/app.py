"""The faust app factory: `create_app(config)` builds the app of ONE processor role.

Each role is one faust app whose id is `agentstream-<role>`, so its consumer group, its tables
(`agentstream-<role>-state-changelog`) and its log lines all carry the processor's stable name.
`agentstream worker --roles scoring,judge` runs one such app per role (streams/worker.py).

Settings are read once, by the CLI, into a `WorkerConfig` that is passed down; nothing here reads the
environment. faust is imported inside `create_app` so `agentstream --help` stays fast.

Roles (`ROLE_REGISTRARS`, one folder each with the same files: `processor.py`, the pure batch logic,
and `role.py`, whose `register(app, config)` wires it on the one batch shell, streams/shell.py):
- `scoring` (the default): streams/scoring/, rule rewards (the pure logic in streams/rules/) and
  trajectory assembly (streams/assembler/) in one app, reading agent.events once;
- `judge`: streams/judge/ (it reads its own `AGENTSTREAM_JUDGE_*` settings).
"""

from __future__ import annotations

import logging
from pathlib import Path

from streams.config import ROLES, WorkerConfig, check_roles
from streams.faust_compat import import_faust
from streams.judge import role as judge_role
from streams.scoring import role as scoring_role

log = logging.getLogger(__name__)

ROLE_REGISTRARS = {
    "scoring": scoring_role.register,
    "judge": judge_role.register,
}
assert set(ROLE_REGISTRARS) == set(ROLES)

__all__ = ["ROLE_REGISTRARS", "create_app"]


def _broker_urls(bootstrap: str) -> list[str]:
    return [f"kafka://{host.strip()}" for host in bootstrap.split(",") if host.strip()]


def create_app(config: WorkerConfig, role: str):
    """A faust app running the processor `role` (its agents, tables and timers registered)."""
    faust = import_faust()

    check_roles((role,))
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
    ROLE_REGISTRARS[role](app, config)
    log.info("%s: app %s ready (broker %s)", role, app_id, config.bootstrap_servers)
    return app

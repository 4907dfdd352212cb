"""`agentstream worker --roles <role>`: run ONE stream processor role as a faust worker in this
process (`faust.Worker` on the app from `streams.app.create_app`).

Several roles are one process each, run by the top floor's supervisor (`infra.supervisor`, used by
`agentstream up` and by `agentstream worker --roles a,b`); it restarts a role that exits with
`EXIT_REPLAY`. Nothing here spawns or supervises processes.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from clients.kafka import ensure_topics, make_consumer
from schemas import topics
from streams.app import create_app
from streams.config import WorkerConfig
from streams.errors import WorkerConfigError
from streams.faust_compat import import_faust

log = logging.getLogger(__name__)


def main(config: WorkerConfig, log_level: str = "INFO") -> int:
    """Create the topics if missing, read their partition count, run the one role of `config`."""
    if len(config.roles) != 1:
        raise WorkerConfigError(f"--roles: one role per worker process, got {','.join(config.roles)!r}")
    ensure_topics(config.bootstrap_servers)
    config = replace(config, partitions=source_partitions(config.bootstrap_servers))
    return run_role(config, config.roles[0], log_level)


def source_partitions(bootstrap: str) -> int:
    """The partition count shared by every topic a processor reads (the state tables use the same,
    so a trajectory's state lives in the partition of its events). Differing counts are refused:
    faust would silently recover only some table partitions."""
    names = (topics.AGENT_EVENTS, topics.REWARD_RULE, topics.REWARD_JUDGE, topics.FEEDBACK_HUMAN)
    consumer = make_consumer(bootstrap, "agentstream-worker-metadata")
    try:
        counts = {name: len(consumer.partitions_for_topic(name) or ()) for name in names}
    finally:
        consumer.close()
    if len(set(counts.values())) != 1 or 0 in counts.values():
        detail = ", ".join(f"{k}={v}" for k, v in counts.items())
        raise WorkerConfigError(
            f"source topics must have the same number of partitions, got {detail} "
            "(create them with `agentstream topics create` before producing)"
        )
    return next(iter(counts.values()))


def run_role(config: WorkerConfig, role: str, log_level: str = "INFO") -> int:
    """Run one role's faust worker in this process until it is stopped."""
    faust = import_faust()
    app = create_app(config, role)
    worker = faust.Worker(app, loglevel=str(log_level).lower(), quiet=True, override_logging=False)
    worker.execute_from_commandline()  # returns (or exits) when the worker stops
    return 0

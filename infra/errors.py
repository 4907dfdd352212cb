"""Exception root of the top floor (httpx style: the tree, then the classes).

    AgentstreamError (schemas.errors)
    └── InfraError
        ├── StackError            infra/supervisor.py: a supervised component failed to start
        ├── DockerUnavailable     infra/docker_engine.py: the docker path without a reachable engine
        ├── TopicAdminError       infra/broker/topics_cli.py: `agentstream topics ...`
        ├── ReadmeError           infra/bench/readme.py: `agentstream bench readme`
        └── BrokerError           infra/broker/errors.py: the embedded broker (its subtree is there)

ClickHouse commands raise `clients.clickhouse.ClickHouseError` (the ground floor's root). Every
message names the option or file and the value received; the CLI prints it as one line.
"""

from __future__ import annotations

from schemas.errors import AgentstreamError


class InfraError(AgentstreamError):
    """Root for the `infra` package: the CLI, the broker, the stack supervisor, demo and benchmarks."""

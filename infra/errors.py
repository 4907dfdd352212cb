"""Exception root of the top floor (httpx style: the tree, then the classes).

    AgentstreamError (schemas.errors)
    └── InfraError
        ├── StackError            `agentstream up`: a component failed to start or stopped
        ├── DockerUnavailable     the docker path without a reachable engine
        ├── TopicAdminError       `agentstream topics ...`
        ├── ClickHouseCommandError `agentstream sql|leaderboard|trajectory|db ...`
        └── BrokerError           the embedded broker (infra/broker/errors.py has its subtree)

Every message names the option or file and the value received; the CLI prints it as one line.
"""

from __future__ import annotations

from schemas.errors import AgentstreamError


class InfraError(AgentstreamError):
    """Root for the `infra` package: the CLI, the broker, the stack supervisor, demo and benchmarks."""

"""Exception root of the top floor (httpx style: the tree, then the classes).

    AgentstreamError (schemas.errors)
    └── InfraError
        ├── StackError            infra/supervisor.py: a supervised component failed to start
        ├── DockerUnavailable     infra/docker_engine.py: the docker path without a reachable engine
        ├── SandboxEngineError    infra/sandbox_engine/errors.py: the sandbox's private engine (subtree there)
        ├── TopicAdminError       infra/commands/topics.py: `agentstream topics ...`
        ├── ReadmeError           infra/bench/readme.py: `agentstream bench readme`
        ├── BenchFailure          infra/bench/sandbox_rollout.py: a benchmark measured a broken path
        ├── FilterError           infra/clickhouse/browse/filters.py: a malformed filter (field, value named)
        ├── ConsoleError          infra/console/: the web console's configuration or startup
        ├── ExportError           infra/export/errors.py: `agentstream export`
        ├── McpToolError          infra/mcp/errors.py: an MCP tool refused its input
        ├── OutputFileError       infra/options/output_file.py: a result file option (`--json`, ...)
        └── BrokerError           infra/broker/errors.py: the embedded broker (its subtree is there)

ClickHouse commands raise `clients.clickhouse.ClickHouseError` (the ground floor's root). Every
message names the option or file and the value received; the CLI prints it as one line.
"""

from __future__ import annotations

from schemas.errors import AgentstreamError


class InfraError(AgentstreamError):
    """Root for the `infra` package: the CLI, the broker, the stack supervisor, demo and benchmarks."""


class FilterError(InfraError):
    """A filter of the trajectory list that cannot be used: names the field and the value."""

    def __init__(self, field: str, value: object, reason: str):
        self.field, self.value, self.reason = field, value, reason
        super().__init__(f"{field}={value!r}: {reason}")


class ConsoleError(InfraError):
    """The web console cannot start as configured (the message names the option)."""

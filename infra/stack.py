"""`agentstream up`: which processes make the embedded stack (broker, one stream worker per role,
sink, batch builder, optionally judge, gateway, policy server, training executor and the web console) and
where they keep their logs and state.

The processes themselves are run by `infra.supervisor.Supervisor` (start order, readiness, restarts
with backoff, stop on SIGTERM / SIGINT in reverse order, no orphans); this module adds what is
particular to a stack under a data directory. It knows nothing about events; each component is an
`agentstream` subcommand.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from infra.errors import InfraError
from infra.supervisor import STOP_GRACE_S, Component, Supervisor
from streams.config import DEFAULT_ROLES, MERGED_ROLES

STATE_FILE = "run/stack.json"


@dataclass
class StackConfig:
    data_dir: Path
    bootstrap_servers: str
    clickhouse_url: str
    broker_port: int = 19092
    embedded_broker: bool = True
    workers: int = 1
    roles: tuple[str, ...] = DEFAULT_ROLES  # the stream roles, one process each per worker slot
    judge: bool = False
    gateway: bool = False
    gateway_port: int = 8080
    policy: bool = False
    policy_port: int = 8000
    batch: bool = True  # the batch builder, `agentstream batch` (component `batch`)
    batch_args: tuple[str, ...] = ()
    train: bool = False
    train_args: tuple[str, ...] = ()
    console: bool = False  # `agentstream up` turns it on unless --no-console
    console_port: int = 8090
    extra_env: dict[str, str] = field(default_factory=dict)

    def query(self, sql) -> list[tuple]:
        """The rows of `sql` (text or an `Sql` with bound values) on the stack's ClickHouse (waits
        while the sink opens chDB)."""
        from clients.clickhouse.client import chdb_path, connect, live_endpoint
        from infra.clickhouse.sql import run

        path = chdb_path(self.clickhouse_url)
        deadline = time.monotonic() + 30
        # the stack's sink serves its chDB: never open the directory here before the sink has (that
        # would find no tables, and take the lock the sink needs)
        while path is not None and not live_endpoint(path) and time.monotonic() < deadline:
            time.sleep(0.2)
        client = connect(self.clickhouse_url, wait_s=30)
        try:
            return run(client, sql)
        finally:
            client.close()


def stack_roles(value: str) -> tuple[str, ...]:
    """`--roles` of `agentstream up`: the stream roles other than the judge (`--judge` adds it),
    which is `scoring` alone (rule rewards and trajectory assembly in one consumer).

    >>> stack_roles(" scoring ")
    ('scoring',)
    """
    roles = tuple(r.strip() for r in value.split(",") if r.strip())
    if roles != ("scoring",):
        merged = [r for r in roles if r in MERGED_ROLES]
        why = f" ({merged[0]!r} is part of scoring now)" if merged else ""
        raise InfraError(f"--roles: {value!r}: the stack's stream role is scoring{why} (judge: --judge)")
    return roles


def components(config: StackConfig) -> list[Component]:
    """The processes of a stack, in start order: one `agentstream worker` process per role per
    worker slot (no supervisor inside the supervisor)."""
    out = []
    if config.embedded_broker:
        out.append(_server("broker", config.broker_port))
    for i in range(config.workers):
        for role in config.roles:
            args = ("worker", "--roles", role, *(("--expect-judge",) if config.judge else ()))
            out.append(Component(role if config.workers == 1 else f"{role}-{i}", args))
    if config.judge:
        out.append(Component("judge", ("worker", "--roles", "judge")))
    if config.console:  # the console reads through the sink's endpoint: start it once the sink serves
        out.append(Component("sink", ("sink", "--ready-file", "run/sink.ready"), ready_file="run/sink.ready"))
    else:
        out.append(Component("sink", ("sink",)))
    if config.batch:
        out.append(Component("batch", ("batch", *config.batch_args)))
    if config.train:  # after the batch builder whose batches it follows; `train_args` may override --kinds
        out.append(Component("executor", ("train", "--follow", "--kinds", "grpo", *config.train_args)))
    if config.gateway:
        out.append(_server("gateway", config.gateway_port))
    if config.policy:  # serves the training executor's newest checkpoint and follows policy.updated
        out.append(_server("policy", config.policy_port))
    if config.console:
        out.append(_server("console", config.console_port))
    return out


def _server(command: str, port: int) -> Component:
    """A component that listens on `port` and writes `run/<command>.ready` once it serves."""
    ready = f"run/{command}.ready"
    return Component(command, (command, "--port", str(port), "--ready-file", ready), ready_file=ready)


class StackSupervisor(Supervisor):
    """The stack's processes under the data directory: logs in `logs/`, state in `run/stack.json`
    (for `agentstream status` and for anyone looking for the stack's PIDs), topics created once the
    broker is ready. Every component is restarted whatever its exit code."""

    def __init__(self, config: StackConfig, on_event=None):
        self.config = config
        self.data_dir = config.data_dir.resolve()
        (self.data_dir / "run").mkdir(parents=True, exist_ok=True)
        super().__init__(
            components(config),
            env={
                "AGENTSTREAM_BOOTSTRAP_SERVERS": config.bootstrap_servers,
                "AGENTSTREAM_CLICKHOUSE_URL": config.clickhouse_url,
                "AGENTSTREAM_DATA_DIR": str(self.data_dir),
                **config.extra_env,
            },
            cwd=self.data_dir,
            log_dir=self.data_dir / "logs",
            on_event=on_event,
        )

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        super().stop(grace_s)
        self._write_state(stopped=True)

    def _started(self, entry) -> None:
        if entry.component.name == "broker":
            from clients.kafka import ensure_topics

            ensure_topics(self.config.bootstrap_servers)

    def _changed(self) -> None:
        if not self._stopping:
            self._write_state()

    def _write_state(self, stopped: bool = False) -> None:
        state = {
            "stopped": stopped,
            "supervisor_pid": os.getpid(),
            "bootstrap_servers": self.config.bootstrap_servers,
            "clickhouse_url": self.config.clickhouse_url,
            "components": {
                name: {
                    "pid": None if stopped or entry.popen is None else entry.popen.pid,
                    "args": list(entry.component.args),
                    "restarts": entry.restarts,
                    "last_exit": entry.last_exit,
                    "started_at": entry.started_at,
                }
                for name, entry in self.running.items()
            },
        }
        path = self.data_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(path)


def embedded_config(data_dir: Path, **overrides) -> StackConfig:
    """A self-contained embedded stack under `data_dir`: broker on a free port, chDB beside it."""
    port = free_port()
    defaults = {
        "bootstrap_servers": f"127.0.0.1:{port}",
        "clickhouse_url": f"chdb://{data_dir / 'clickhouse'}",
        "broker_port": port,
        "console_port": free_port(),
    }
    return StackConfig(data_dir=data_dir, **{**defaults, **overrides})


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_state(data_dir: Path) -> dict | None:
    path = data_dir / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else None

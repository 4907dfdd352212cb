"""`agentstream up`: start and supervise the embedded stack (broker, stream workers, sink, trainer,
optionally judge and gateway) as child processes.

Owns process lifecycle only: start order, readiness, restarts with backoff, logs under the data
directory, a state file for `agentstream status`, and a clean shutdown with a hard-kill fallback.
It knows nothing about events; each component is an `agentstream` subcommand.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

STATE_FILE = "run/stack.json"


@dataclass(frozen=True)
class Component:
    """One supervised process: `agentstream <args>`."""

    name: str
    args: tuple[str, ...]
    ready_file: str | None = None  # relative to the data dir; the component writes it when serving


@dataclass
class StackConfig:
    data_dir: Path
    bootstrap_servers: str
    clickhouse_url: str
    broker_port: int = 19092
    embedded_broker: bool = True
    workers: int = 1
    judge: bool = False
    gateway: bool = False
    gateway_port: int = 8080
    trainer: bool = True
    trainer_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)


def components(config: StackConfig) -> list[Component]:
    """The processes of a stack, in start order."""
    out = []
    if config.embedded_broker:
        out.append(
            Component(
                "broker",
                ("broker", "--port", str(config.broker_port), "--ready-file", "run/broker.ready"),
                ready_file="run/broker.ready",
            )
        )
    for i in range(config.workers):
        out.append(
            Component(
                f"worker-{i}" if config.workers > 1 else "worker", ("worker", "--roles", "rules,assembler")
            )
        )
    if config.judge:
        out.append(Component("judge", ("worker", "--roles", "judge")))
    out.append(Component("sink", ("sink",)))
    if config.trainer:
        out.append(Component("trainer", ("trainer", *config.trainer_args)))
    if config.gateway:
        out.append(
            Component(
                "gateway",
                ("gateway", "--port", str(config.gateway_port), "--ready-file", "run/gateway.ready"),
                ready_file="run/gateway.ready",
            )
        )
    return out


@dataclass
class _Running:
    component: Component
    popen: subprocess.Popen | None = None
    restarts: int = 0
    next_start: float = 0.0
    started_at: float = 0.0
    last_exit: int | None = None


class StackError(Exception):
    pass


class Supervisor:
    """Starts components, restarts crashed ones with exponential backoff, stops them all cleanly."""

    max_backoff_s = 30.0

    def __init__(self, config: StackConfig, on_event=None):
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.on_event = on_event or (lambda message: log.info("%s", message))
        self.running = {c.name: _Running(c) for c in components(config)}
        self._stopping = False

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self, ready_timeout_s: float = 60.0) -> None:
        (self.data_dir / "run").mkdir(parents=True, exist_ok=True)
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        for name, entry in self.running.items():
            self._spawn(entry)
            if entry.component.ready_file:
                self._wait_ready(entry, ready_timeout_s)
            if name == "broker":
                self._create_topics()
        self._write_state()

    def poll(self) -> None:
        """Check every component once; restart those that died (call in a loop)."""
        now = time.monotonic()
        for entry in self.running.values():
            if entry.popen is not None and entry.popen.poll() is not None:
                self._on_exit(entry, now)
            if entry.popen is None and now >= entry.next_start and not self._stopping:
                self._spawn(entry)
                self.on_event(f"{entry.component.name} restarted (restart #{entry.restarts})")
                self._write_state()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every component in reverse start order, SIGKILL what is left after `grace_s`."""
        self._stopping = True
        entries = [e for e in reversed(list(self.running.values())) if e.popen is not None]
        for entry in entries:
            _signal_group(entry.popen.pid, signal.SIGTERM)
            try:
                entry.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.on_event(f"{entry.component.name} ignored SIGTERM for {grace_s:.0f}s; killing it")
                _signal_group(entry.popen.pid, signal.SIGKILL)
                entry.popen.wait(timeout=10)
        self._write_state(stopped=True)

    def run_forever(self, interval_s: float = 0.5) -> None:
        while True:
            self.poll()
            time.sleep(interval_s)

    # --- internals --------------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "AGENTSTREAM_BOOTSTRAP_SERVERS": self.config.bootstrap_servers,
            "AGENTSTREAM_CLICKHOUSE_URL": self.config.clickhouse_url,
            "AGENTSTREAM_DATA_DIR": str(self.data_dir),
            **self.config.extra_env,
        }

    def _spawn(self, entry: _Running) -> None:
        component = entry.component
        if component.ready_file:
            (self.data_dir / component.ready_file).unlink(missing_ok=True)
        log_file = open(self.data_dir / "logs" / f"{component.name}.log", "ab")  # noqa: SIM115
        entry.popen = subprocess.Popen(
            [sys.executable, "-m", "infra.cli", *component.args],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=self._env(),
            cwd=self.data_dir,
            start_new_session=True,
        )
        log_file.close()
        entry.started_at = time.time()

    def _wait_ready(self, entry: _Running, timeout_s: float) -> None:
        path = self.data_dir / entry.component.ready_file
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if entry.popen.poll() is not None:
                raise StackError(
                    f"{entry.component.name} exited with {entry.popen.returncode} during start; "
                    f"see {self.data_dir / 'logs' / (entry.component.name + '.log')}"
                )
            if time.monotonic() > deadline:
                raise StackError(f"{entry.component.name} not ready after {timeout_s:.0f}s")
            time.sleep(0.05)

    def _create_topics(self) -> None:
        from clients.kafka import ensure_topics

        ensure_topics(self.config.bootstrap_servers)

    def _on_exit(self, entry: _Running, now: float) -> None:
        entry.last_exit = entry.popen.returncode
        entry.popen = None
        if self._stopping:
            return
        backoff = min(self.max_backoff_s, 2.0**entry.restarts)
        entry.restarts += 1
        entry.next_start = now + backoff
        self.on_event(
            f"{entry.component.name} exited with code {entry.last_exit}; restarting in {backoff:.0f}s "
            f"(log: {self.data_dir / 'logs' / (entry.component.name + '.log')})"
        )
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


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass

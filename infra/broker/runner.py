"""The broker's process lifecycle: open the store, serve until SIGTERM/SIGINT (or `stop`), shut down
cleanly (connections closed, every log flushed and closed, so the next start needs no recovery).

Owns the lifecycle only: serving is in server.py; the `agentstream broker` command that builds a
`BrokerConfig` from its options is infra/commands/broker.py (the broker never imports the CLI).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

from infra.broker.state import BrokerConfig, BrokerState

log = logging.getLogger(__name__)

NEVER_MS = 2**62  # an interval no append reaches: flushing is left to the group commit


def broker_dir(data_dir: Path) -> Path:
    """Where the broker keeps its logs inside the agentstream data directory (like chDB's `clickhouse/`)."""
    return Path(data_dir) / "broker"


def open_store(config: BrokerConfig):
    """The durable store under `config.data_dir` with the broker-wide default log settings."""
    from infra.broker.log_config import LogConfig
    from infra.broker.store import BrokerStore

    if config.flush == "always":
        # the group commit (durability.py) fsyncs before every acknowledgement, so appends only write
        defaults = LogConfig(flush="interval", flush_interval_ms=NEVER_MS)
    else:
        defaults = LogConfig(flush="interval", flush_interval_ms=config.flush_interval_ms)
    store = BrokerStore(config.data_dir, defaults)
    if config.flush == "always":
        try:
            restored = store.open_write_ahead()
        except BaseException:
            store.close()
            raise
        if restored:
            log.warning("restored %d records from the write-ahead file", restored)
    return store


async def serve(
    config: BrokerConfig, ready_file: Path | None = None, stop: asyncio.Event | None = None
) -> None:
    """Open the store, listen, announce readiness, and run until `stop` is set or a signal arrives."""
    from infra.broker.server import BrokerServer

    stop = stop or asyncio.Event()
    _install_signal_handlers(stop)
    store = open_store(config)
    server = BrokerServer(BrokerState(config, store))
    try:
        host, port = await server.start()
        if ready_file is not None:
            _write_ready_file(ready_file, f"{host}:{port}")
        await stop.wait()
        log.info("shutting down")
    finally:
        await server.close()


def _install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread (embedded use)
            pass


def _write_ready_file(path: Path, address: str) -> None:
    """Atomically, so a watcher never reads half an address."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(address)
    os.replace(tmp, path)

"""The supervised embedded stack (`agentstream up`'s supervisor) for system tests, polled in a thread
so that a process that exits is restarted (and counted) as in production; stopped on exit."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.stack import StackSupervisor, embedded_config


@contextmanager
def running_stack(data_dir: Path, train: bool = False) -> Iterator[tuple]:
    """Yields (config, supervisor); `supervisor.running[name].restarts` counts each role's restarts."""
    config = embedded_config(data_dir, train=train)
    supervisor, stop = StackSupervisor(config), threading.Event()
    poller = threading.Thread(
        target=lambda: [supervisor.poll() or time.sleep(0.2) for _ in iter(stop.is_set, True)]
    )
    supervisor.start()
    poller.start()
    try:
        yield config, supervisor
    finally:
        stop.set()
        poller.join()
        supervisor.stop()

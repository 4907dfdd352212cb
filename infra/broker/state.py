"""What every request handler shares: the broker's configuration, storage, groups and wake-ups.

`BrokerState` is built once by the server and passed to each handler. It owns the node identity
the broker advertises (id, host, port), the storage (`BrokerStore`), the group coordinator and the
append notification that wakes long-polling fetches. It does no network I/O.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from infra.broker.durability import GroupCommit
from infra.broker.groups import CoordinatorConfig, GroupCoordinator
from infra.broker.protocol import LEAN_PROFILE

GROUPS_FILE = "groups.json"

log = logging.getLogger(__name__)

NODE_ID = 1
CLUSTER_ID = "agentstream-embedded"
DEFAULT_MAX_REQUEST_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes


@dataclass(frozen=True)
class BrokerConfig:
    """Settings of one broker process (CLI options map onto these fields)."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 19092
    flush: str = "always"  # "always": fsync before acknowledging; "interval": every flush_interval_ms
    flush_interval_ms: int = 1000
    default_partitions: int = 1
    auto_create_topics: bool = True
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    retention_check_interval_ms: int = 5_000
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    profile: dict[int, tuple[int, int]] = field(default_factory=lambda: dict(LEAN_PROFILE))


class AppendSignal:
    """Wakes every waiting fetch when any partition receives records (cheap: one Event per append)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except TimeoutError:
            pass


class BrokerState:
    """Shared state of a running broker; handlers read and mutate it on the event loop."""

    def __init__(self, config: BrokerConfig, store) -> None:
        self.config = config
        self.store = store
        self.groups = GroupCoordinator(config.coordinator)
        self._restore_groups()
        self.groups.on_membership_change = self._save_groups
        self.appended = AppendSignal()
        self.commit = GroupCommit()
        self.node_id = NODE_ID
        self.cluster_id = CLUSTER_ID
        self.advertised_host = config.host
        self.advertised_port = config.port

    def _groups_path(self) -> Path:
        return Path(self.store.data_dir) / GROUPS_FILE

    def _restore_groups(self) -> None:
        path = self._groups_path()
        try:
            snapshot = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except ValueError:
            log.warning("%s: unreadable group membership, groups will rebalance", path)
            return
        count = self.groups.restore(snapshot)
        log.info("restored %d stable consumer groups from %s", count, path)

    def _save_groups(self) -> None:
        """Persist stable group membership (rare: once per completed rebalance or emptied group)."""
        from infra.broker.segment import write_file_atomic

        data = json.dumps(self.groups.snapshot()).encode()
        write_file_atomic(self._groups_path(), data, sync=True)

    @property
    def acks_wait_for_fsync(self) -> bool:
        return self.config.flush == "always"

    @property
    def profile(self) -> dict[int, tuple[int, int]]:
        return self.config.profile

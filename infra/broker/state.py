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
from typing import Literal

from infra.broker.durability import GroupCommit
from infra.broker.errors import BrokerError
from infra.broker.groups import CoordinatorConfig, GroupCoordinator
from infra.broker.protocol import LEAN_PROFILE
from schemas.settings import DEFAULT_BROKER_HOST, DEFAULT_BROKER_PORT

GROUPS_FILE = "groups.json"

log = logging.getLogger(__name__)

NODE_ID = 1
CLUSTER_ID = "agentstream-embedded"
DEFAULT_MAX_REQUEST_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes


@dataclass(frozen=True)
class BrokerConfig:
    """Settings of one broker process; `agentstream broker`'s options are generated from the
    documented fields (infra/options/configs.py)."""

    data_dir: Path
    host: str = field(
        default=DEFAULT_BROKER_HOST, metadata={"help": "address to bind", "env": "AGENTSTREAM_BROKER_HOST"}
    )
    port: int = field(
        default=DEFAULT_BROKER_PORT,
        metadata={
            "help": "port to listen on (0: a free port, see --ready-file)",
            "env": "AGENTSTREAM_BROKER_PORT",
        },
    )
    flush: Literal["always", "interval"] = field(
        default="always",
        metadata={
            "help": "always: fsync before acknowledging a produce; interval: fsync every --flush-interval-ms"
        },
    )
    flush_interval_ms: int = field(default=1000, metadata={"help": "fsync period with --flush interval"})
    group_commit_interval_ms: float = field(
        default=10.0,
        metadata={
            "help": "with --flush always: fsync rounds start at most this often (ms), so the produce "
            "requests of one interval share an fsync per partition; a request after a quiet spell is "
            "synced at once (0: a round per request as it comes)"
        },
    )
    group_commit_max_interval_ms: float = field(
        default=10.0,
        metadata={
            "help": "with --flush always: the fsync round interval grows with the rate of appended "
            "bytes, from --group-commit-interval-ms at 2 MB/s to this (ms) at 8 MB/s and above; 40 "
            "cuts the stack's CPU per step by about 15% at 1,000 steps/s, but holds a producer "
            "waiting for each ack (the SDK flat out) to about a third of its throughput"
        },
    )
    default_partitions: int = field(default=1, metadata={"help": "partitions of auto-created topics"})
    auto_create_topics: bool = field(
        default=True, metadata={"help": "create unknown topics on a Metadata request that allows it"}
    )
    max_request_bytes: int = field(
        default=DEFAULT_MAX_REQUEST_BYTES,
        metadata={"help": "largest request frame accepted; larger frames close the connection"},
    )
    retention_check_interval_ms: int = field(
        default=5_000,
        metadata={"help": "how often old segments are checked against retention.ms / retention.bytes"},
    )
    log_cleaner_interval_ms: int = field(
        default=5_000,
        metadata={"help": "how often compacted topics are checked for cleaning (cleanup.policy=compact)"},
    )
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig, metadata={"prefix": ""})
    profile: dict[int, tuple[int, int]] = field(default_factory=lambda: dict(LEAN_PROFILE))

    def __post_init__(self) -> None:
        if self.group_commit_interval_ms < 0:
            raise BrokerError(
                f"--group-commit-interval-ms: must be >= 0, got {self.group_commit_interval_ms!r}"
            )
        if self.group_commit_max_interval_ms < self.group_commit_interval_ms:
            raise BrokerError(
                "--group-commit-max-interval-ms: must be >= --group-commit-interval-ms "
                f"({self.group_commit_interval_ms!r}), got {self.group_commit_max_interval_ms!r}"
            )


class AppendSignal:
    """Wakes a long-polling fetch once the partitions it reads received enough bytes for it.

    A fetch watches only its own partitions and counts the bytes appended there, so an append wakes
    only the fetches it can satisfy, and a waiting fetch reads its partitions again only once the
    bytes it still needs arrived (or at its deadline), not on every append anywhere: with a few
    consumers long-polling many partitions, re-reading on every append was most of the broker's
    fetch work."""

    def __init__(self) -> None:
        self._watches: dict[tuple[str, int], set[_Watch]] = {}

    def notify(self, arrived: dict[tuple[str, int], int]) -> None:
        """`arrived`: (topic, partition) -> bytes just appended there."""
        for key, size in arrived.items():
            for watch in tuple(self._watches.get(key, ())):
                watch.add(size)

    async def wait(self, partitions: list[tuple[str, int]], need: int, timeout_s: float) -> None:
        """Return once `need` bytes were appended to `partitions` in all, or after `timeout_s`."""
        loop = asyncio.get_running_loop()
        watch = _Watch(need, loop.create_future())
        keys = set(partitions)
        for key in keys:
            self._watches.setdefault(key, set()).add(watch)
        timer = loop.call_later(timeout_s, watch.finish)
        try:
            await watch.future
        finally:
            timer.cancel()
            for key in keys:
                watches = self._watches.get(key)
                if watches is not None:
                    watches.discard(watch)
                    if not watches:
                        del self._watches[key]


class _Watch:
    """One waiting fetch: the bytes it still needs, and the future that releases it."""

    __slots__ = ("future", "need")

    def __init__(self, need: int, future: asyncio.Future) -> None:
        self.need, self.future = need, future

    def add(self, size: int) -> None:
        self.need -= size
        if self.need <= 0:
            self.finish()

    def finish(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


class BrokerState:
    """Shared state of a running broker; handlers read and mutate it on the event loop."""

    def __init__(self, config: BrokerConfig, store) -> None:
        self.config = config
        self.store = store
        self.groups = GroupCoordinator(config.coordinator)
        self._restore_groups()
        self.groups.on_membership_change = self._save_groups
        self.appended = AppendSignal()
        self.commit = GroupCommit(
            config.group_commit_interval_ms / 1000, config.group_commit_max_interval_ms / 1000
        )
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
            count = self.groups.restore(snapshot)
        except FileNotFoundError:
            return
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # only membership is lost (committed offsets live in group_offsets.jsonl): a rebalance
            self.groups.groups.clear()
            log.error("%s: unreadable group membership (%r), groups will rebalance", path, exc)
            return
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

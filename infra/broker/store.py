"""The broker's durable state on disk: topics, their partition logs, group offsets, producer ids.

Owns the files directly under the broker data directory:

- `topics.json`: topic name -> topic id (stable uuid), partition count, config overrides
  (replaced atomically: tmp + fsync + rename).
- `<topic>-<partition>/`: one `PartitionLog` per partition (see `infra.broker.log`).
- `group_offsets.jsonl`: committed consumer-group offsets, one JSON line per commit call, fsynced
  before the call returns, or (`sync=False`, what the broker's OffsetCommit does under `--flush
  always`) in the next group commit round, through `offsets_journal`; compacted into a fresh file on
  open and when it grows.
- `producer_ids.json`: the next unallocated block of producer ids, so an id is never handed out twice.

It must not know the wire protocol or group membership (the coordinator lives in the server layer);
it only stores what they decide.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from clients.files import fsync_dir
from infra.broker.compaction import compact_log
from infra.broker.errors import (
    BrokerStorageError,
    InvalidPartitionsError,
    InvalidTopicError,
    StorageIOError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from infra.broker.log import PartitionLog
from infra.broker.log_config import LogConfig
from infra.broker.segment import sync_copy, write_file_atomic

log = logging.getLogger(__name__)

TOPICS_FILE = "topics.json"
OFFSETS_FILE = "group_offsets.jsonl"
WAL_DIR = "wal"  # the write-ahead files (infra/broker/wal.py)
PRODUCER_IDS_FILE = "producer_ids.json"
CORRUPT_DIR = "corrupt"  # copies of damaged state files, kept for inspection
LOCK_FILE = ".lock"
PRODUCER_ID_BLOCK = 1000
MAX_TOPIC_NAME = 249
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")
_COMPACT_MIN_LINES = 10_000

OffsetKey = tuple[str, int]
OffsetValue = tuple[int, str | None, int]  # (offset, metadata, leader_epoch)


def topic_defaults(config: LogConfig) -> dict[str, str]:
    """The full default topic config (DescribeConfigs answers these plus a topic's overrides)."""
    always = config.flush == "always"
    return {
        "cleanup.policy": "delete",
        "retention.ms": str(config.retention_ms),
        "retention.bytes": str(config.retention_bytes),
        "segment.bytes": str(config.segment_bytes),
        "segment.ms": "604800000",
        "index.interval.bytes": str(config.index_interval_bytes),
        "flush.messages": "1" if always else "9223372036854775807",
        "flush.ms": "0" if always else str(config.flush_interval_ms),
        "min.insync.replicas": "1",
        "max.message.bytes": str(config.max_message_bytes),
        "message.timestamp.type": config.timestamp_type,
        "compression.type": "producer",
        "min.compaction.lag.ms": str(config.min_compaction_lag_ms),
        "delete.retention.ms": str(config.delete_retention_ms),
        "min.cleanable.dirty.ratio": str(config.min_cleanable_dirty_ratio),
    }


TOPIC_DEFAULTS: dict[str, str] = topic_defaults(LogConfig())


@dataclass
class TopicMeta:
    """A topic as the store knows it. `configs` holds only the overrides given at creation."""

    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"topic_id": str(self.topic_id), "partitions": self.partitions, "configs": self.configs}

    @classmethod
    def from_json(cls, name: str, data: dict) -> TopicMeta:
        return cls(name, uuid.UUID(data["topic_id"]), int(data["partitions"]), dict(data["configs"]))


def validate_topic_name(name: str) -> None:
    """Kafka's rules: 1-249 characters from [a-zA-Z0-9._-], not "." or ".."."""
    if not isinstance(name, str) or not name or name in (".", ".."):
        raise InvalidTopicError(
            f"topic: name must be a non-empty string other than '.' or '..' (got {name!r})"
        )
    if len(name) > MAX_TOPIC_NAME:
        raise InvalidTopicError(f"topic: name longer than {MAX_TOPIC_NAME} characters (got {len(name)})")
    if not _LEGAL_TOPIC.fullmatch(name):
        raise InvalidTopicError(f"topic: name may only contain [a-zA-Z0-9._-] (got {name!r})")


class BrokerStore:
    """Topics, partition logs, committed offsets and producer ids under one data directory.

    Thread-safe. Every partition log is opened (and recovered) when the store opens.
    """

    def __init__(self, data_dir: Path, default_config: LogConfig | None = None):
        self.data_dir = Path(data_dir)
        self.default_config = default_config or LogConfig()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._dir_lock = _lock_data_dir(self.data_dir)
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        try:
            self._topics: dict[str, TopicMeta] = self._load_topics()
            for meta in self._topics.values():
                self._open_logs(meta)
            self._warn_orphans()
            self._offsets: dict[str, dict[OffsetKey, OffsetValue]] = {}
            self._offsets_fh = self._open_offsets()
            self._offsets_dirty = False  # lines written with sync=False, not fsynced yet
            self.write_ahead = None  # infra/broker/wal.py, set by `open_write_ahead`
            self.offsets_journal = _Flushable(self.flush_offsets)
            self._next_pid, self._pid_limit = self._load_producer_ids()
        except BaseException:
            for partition_log in self._logs.values():
                partition_log.close()
            if self._dir_lock is not None:
                self._dir_lock.close()
            raise

    # -- topics
    def _load_topics(self) -> dict[str, TopicMeta]:
        path = self.data_dir / TOPICS_FILE
        if not path.exists():
            return {}
        try:
            data = json.loads(path.read_bytes())
            return {name: TopicMeta.from_json(name, t) for name, t in data["topics"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BrokerStorageError(f"{path}: not a valid topics file ({exc!r}); fix or restore it") from exc

    def _save_topics(self) -> None:
        data = {"topics": {name: meta.to_json() for name, meta in self._topics.items()}}
        write_file_atomic(self.data_dir / TOPICS_FILE, json.dumps(data, indent=1).encode(), sync=True)
        fsync_dir(self.data_dir)

    def log_config(self, meta: TopicMeta) -> LogConfig:
        return LogConfig.from_topic_config(meta.configs, base=self.default_config)

    def _open_logs(self, meta: TopicMeta) -> None:
        config = self.log_config(meta)
        for p in range(meta.partitions):
            self._logs[(meta.name, p)] = PartitionLog(self._partition_dir(meta.name, p), config)

    def _warn_orphans(self) -> None:
        """Partition directories no topic owns (a crashed delete, a hand-edited topics.json) are kept,
        not deleted: the operator decides. Creating the topic again wipes them."""
        known = {self._partition_dir(t, p).name for t, p in self._logs}
        for path in self.data_dir.iterdir():
            name, _, partition = path.name.rpartition("-")
            if path.is_dir() and name and partition.isdigit() and path.name not in known:
                log.warning("partition directory %s belongs to no topic in %s; ignored", path, TOPICS_FILE)

    def _partition_dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / f"{topic}-{partition}"

    def create_topic(self, name: str, partitions: int, configs: dict[str, str] | None = None) -> TopicMeta:
        """Create a topic; TopicExistsError, InvalidTopicError, InvalidPartitionsError, InvalidConfigError."""
        validate_topic_name(name)
        configs = {k: str(v) for k, v in (configs or {}).items() if v is not None}
        if not isinstance(partitions, int) or partitions < 1:
            raise InvalidPartitionsError(f"partitions: must be at least 1 (got {partitions!r})")
        with self._lock:
            if name in self._topics:
                raise TopicExistsError(f"topic: {name!r} already exists")
            meta = TopicMeta(name, uuid.uuid4(), partitions, configs)
            self.log_config(meta)  # raises InvalidConfigError before anything is written
            self._remove_stale_dirs(name)
            self._topics[name] = meta
            self._save_topics()
            self._open_logs(meta)
            fsync_dir(self.data_dir)
            log.info("created topic %s (%d partitions, configs %s)", name, partitions, configs)
            return meta

    def _remove_stale_dirs(self, name: str) -> None:
        """Partition directories left by a delete that crashed half way must not resurrect old data."""
        prefix = name + "-"
        for path in self.data_dir.glob(f"{name}-*"):  # topic names hold no glob metacharacters
            suffix = path.name[len(prefix) :]
            if path.is_dir() and suffix.isdigit():
                log.warning("removing stale partition directory %s", path)
                shutil.rmtree(path, ignore_errors=True)

    def delete_topic(self, name: str) -> None:
        """Delete a topic, its data and its committed offsets. UnknownTopicError if absent."""
        with self._lock:
            meta = self._topics.pop(name, None)
            if meta is None:
                raise UnknownTopicError(f"topic: {name!r} does not exist")
            self._save_topics()
            for p in range(meta.partitions):
                self._logs.pop((name, p)).delete()
            self._append_offsets_line({"drop_topic": name})
            for offsets in self._offsets.values():
                for key in [k for k in offsets if k[0] == name]:
                    del offsets[key]
            log.info("deleted topic %s", name)

    def topics(self) -> dict[str, TopicMeta]:
        with self._lock:
            return dict(self._topics)

    def topic(self, name: str) -> TopicMeta | None:
        return self._topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicMeta | None:
        with self._lock:
            return next((m for m in self._topics.values() if m.topic_id == topic_id), None)

    def topic_configs(self, name: str) -> dict[str, str]:
        """Defaults merged with the topic's overrides (what DescribeConfigs returns)."""
        meta = self._topics.get(name)
        if meta is None:
            raise UnknownTopicError(f"topic: {name!r} does not exist")
        return {**topic_defaults(self.default_config), **meta.configs}

    def log(self, topic: str, partition: int) -> PartitionLog:
        """The log of one partition. UnknownTopicError / UnknownPartitionError."""
        found = self._logs.get((topic, partition))
        if found is not None:
            return found
        meta = self._topics.get(topic)
        if meta is None:
            raise UnknownTopicError(f"topic: {topic!r} does not exist")
        raise UnknownPartitionError(
            f"partition: {partition!r} does not exist in topic {topic!r} ({meta.partitions} partitions)"
        )

    # -- group offsets
    def _open_offsets(self):
        path = self.data_dir / OFFSETS_FILE
        if path.exists():
            with open(path, "rb") as fh:
                lines = fh.read().split(b"\n")
            bad = [n for n, line in enumerate(lines, 1) if line and not self._replay_offsets_line(line)]
            if bad:
                self._report_bad_offsets(path, bad, last=len(lines) - (not lines[-1]))
        self._write_compacted_offsets()
        return open(path, "ab")

    def _replay_offsets_line(self, line: bytes) -> bool:
        try:
            self._apply_offsets_entry(json.loads(line))
        except (ValueError, KeyError, TypeError, AttributeError):
            return False
        return True

    def _report_bad_offsets(self, path: Path, bad: list[int], last: int) -> None:
        """A torn last line is a commit a crash interrupted (never acknowledged): WARNING. Any other
        unreadable line is damage: ERROR. Either way the file is kept aside before it is compacted."""
        kept = self.data_dir / CORRUPT_DIR / f"{OFFSETS_FILE}.{int(time.time())}"
        kept.parent.mkdir(exist_ok=True)
        shutil.copyfile(path, kept)
        torn = bad == [last]
        log.log(
            logging.WARNING if torn else logging.ERROR,
            "%s: %s %s unreadable, ignored (the commits on them are lost; groups resume from the "
            "commits before); the file is kept in %s",
            path,
            "line" if len(bad) == 1 else "lines",
            ", ".join(map(str, bad[:20])),
            kept,
        )

    def _apply_offsets_entry(self, entry: dict) -> None:
        if "drop_topic" in entry:
            for offsets in self._offsets.values():
                for key in [k for k in offsets if k[0] == entry["drop_topic"]]:
                    del offsets[key]
        elif entry.get("delete"):
            self._offsets.pop(entry["g"], None)
        else:
            group = self._offsets.setdefault(entry["g"], {})
            for topic, partition, offset, metadata, epoch in entry["c"]:
                group[(topic, partition)] = (offset, metadata, epoch)

    def _write_compacted_offsets(self) -> None:
        lines = [
            json.dumps({"g": g, "c": [[t, p, *v] for (t, p), v in offs.items()]}) + "\n"
            for g, offs in self._offsets.items()
            if offs
        ]
        write_file_atomic(self.data_dir / OFFSETS_FILE, "".join(lines).encode(), sync=True)
        self._offset_lines = len(lines)

    def _append_offsets_line(self, entry: dict, sync: bool = True) -> None:
        self._offsets_fh.write(json.dumps(entry, separators=(",", ":")).encode() + b"\n")
        self._offsets_fh.flush()
        if sync:
            os.fsync(self._offsets_fh.fileno())
        else:
            self._offsets_dirty = True
        self._offset_lines += 1
        if self._offset_lines > _COMPACT_MIN_LINES and self._offset_lines > 4 * len(self._offsets):
            self._offsets_fh.close()
            self._write_compacted_offsets()  # every offset, fsynced
            self._offsets_dirty = False
            self._offsets_fh = open(self.data_dir / OFFSETS_FILE, "ab")  # noqa: SIM115 - lives with the store

    def flush_offsets(self) -> None:
        """fsync the offsets committed with `sync=False`. Safe to call from another thread (the
        group commit's): the lock is not held during the fsync."""
        with self._lock:
            if not self._offsets_dirty or self._offsets_fh.closed:
                return
            fd = os.dup(self._offsets_fh.fileno())  # survives a concurrent compaction or close
            self._offsets_dirty = False
        sync_copy(fd, self._offsets_unsynced)

    def _offsets_unsynced(self) -> None:
        self._offsets_dirty = True

    def commit_offsets(self, group: str, offsets: dict[OffsetKey, OffsetValue], sync: bool = True) -> None:
        """Store (offset, metadata, leader_epoch) per (topic, partition); durable when this returns,
        or with `sync=False` once `flush_offsets()` has run (`offsets_journal` joins a group commit
        round). `committed()` shows them at once either way."""
        if not offsets:
            return
        rows = [[t, int(p), int(o), m, int(e)] for (t, p), (o, m, e) in offsets.items()]
        with self._lock:
            try:
                self._append_offsets_line({"g": group, "c": rows}, sync)
            except OSError as exc:
                raise StorageIOError(f"commit of offsets for group {group!r} failed: {exc}") from exc
            stored = self._offsets.setdefault(group, {})
            for t, p, o, m, e in rows:
                stored[(t, p)] = (o, m, e)

    def committed(self, group: str) -> dict[OffsetKey, OffsetValue]:
        with self._lock:
            return dict(self._offsets.get(group, {}))

    def groups_with_offsets(self) -> list[str]:
        with self._lock:
            return sorted(g for g, offs in self._offsets.items() if offs)

    def delete_group_offsets(self, group: str) -> None:
        with self._lock:
            if self._offsets.pop(group, None) is not None:
                self._append_offsets_line({"g": group, "delete": True})

    # -- producer ids
    def _load_producer_ids(self) -> tuple[int, int]:
        path = self.data_dir / PRODUCER_IDS_FILE
        if not path.exists():
            return 0, 0
        try:
            start = int(json.loads(path.read_bytes())["next_block"])
        except (ValueError, KeyError, TypeError) as exc:
            # an id must never be handed out twice: continue far above any block ever reserved
            start = int(time.time() * 1000) * PRODUCER_ID_BLOCK
            log.error("%s: unreadable (%r); producer ids continue from %d", path, exc, start)
        return start, start  # the first allocation persists a new block

    def next_producer_id(self) -> int:
        """A producer id never handed out before, also across restarts (ids are reserved in blocks)."""
        with self._lock:
            if self._next_pid >= self._pid_limit:
                limit = self._next_pid + PRODUCER_ID_BLOCK
                write_file_atomic(
                    self.data_dir / PRODUCER_IDS_FILE, json.dumps({"next_block": limit}).encode(), sync=True
                )
                self._pid_limit = limit
            pid = self._next_pid
            self._next_pid += 1
            return pid

    # -- maintenance and lifecycle
    def apply_retention(self, now_ms: int) -> int:
        """Apply retention to every partition; returns how many segments were deleted."""
        with self._lock:
            logs = list(self._logs.values())
        return sum(pl.apply_retention(now_ms) for pl in logs)

    def compact_all(self, now_ms: int) -> int:
        """Compact every partition whose topic has cleanup.policy compact (and enough to clean);
        returns how many were cleaned. A partition that fails is logged and does not stop the rest."""
        with self._lock:
            logs = [(key, pl) for key, pl in self._logs.items() if pl.config.compact]
        cleaned = 0
        for (topic, partition), pl in logs:
            try:
                cleaned += compact_log(pl, now_ms) is not None
            except Exception:
                log.exception("compaction of %s-%d failed; retrying at the next check", topic, partition)
        return cleaned

    def open_write_ahead(self) -> int:
        """Appends are framed in one write-ahead file, fsynced once per group commit round (wal.py).
        Replays what a crash left first; returns the records restored."""
        from infra.broker.wal import WriteAhead

        wal = WriteAhead(self.data_dir / WAL_DIR)
        restored = wal.replay(self._log_by_id)
        self.flush_all()
        wal.close()  # every frame is in its log and fsynced: start empty
        self.write_ahead = wal
        return restored

    def _log_by_id(self, topic_id: uuid.UUID, partition: int) -> PartitionLog | None:
        meta = self.topic_by_id(topic_id)
        if meta is None or not 0 <= partition < meta.partitions:
            return None
        return self._logs.get((meta.name, partition))

    def flush_all(self) -> None:
        with self._lock:
            logs = list(self._logs.values())
        for pl in logs:
            pl.flush()

    def close(self) -> None:
        """Close every log cleanly (next open skips the full CRC scan) and the offsets file."""
        with self._lock:
            for pl in self._logs.values():
                pl.close()
            if self.write_ahead is not None:  # after the logs: they hold everything it framed
                self.write_ahead.close()
            if not self._offsets_fh.closed:
                self._offsets_fh.close()
            if self._dir_lock is not None:
                self._dir_lock.close()


class _Flushable:
    """The offsets file as the group commit sees a partition log: something with `flush()`."""

    def __init__(self, flush) -> None:
        self.flush = flush


def _lock_data_dir(data_dir: Path):
    """Hold an exclusive lock on the data directory: two brokers writing one log would corrupt it.

    The OS drops the lock when the process dies (kill -9 included). None where fcntl is missing.
    """
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks here
        return None
    fh = open(data_dir / LOCK_FILE, "a+")  # noqa: SIM115 - held for the store's lifetime
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "?"
        fh.close()
        raise BrokerStorageError(
            f"data directory {data_dir} is in use by another broker (pid {holder}); stop it or use another"
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(str(os.getpid()))
    fh.flush()
    return fh

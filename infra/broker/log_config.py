"""Settings of one partition log, and how Kafka topic configs map onto them.

Owns `LogConfig`: segment size, retention, compaction, flush policy, index density, batch size limit
and timestamp type, with `from_topic_config` reading the Kafka config keys a CreateTopics carries.
It does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from infra.broker.errors import InvalidConfigError
from infra.broker.segment import MAX_SEGMENT_BYTES


@dataclass
class LogConfig:
    """How a partition log rolls, retains, compacts and flushes. Defaults: 64 MiB segments, 7 days,
    no compaction, fsync always."""

    segment_bytes: int = 64 * 1024 * 1024
    retention_ms: int = 7 * 24 * 3600 * 1000  # -1 = keep forever
    retention_bytes: int = -1  # -1 = no size limit
    flush: str = "always"  # "always": fsync before append returns; "interval": every flush_interval_ms
    flush_interval_ms: int = 1000
    index_interval_bytes: int = 4096
    max_message_bytes: int = 1048588  # largest batch accepted (Kafka's default)
    timestamp_type: str = "CreateTime"  # or "LogAppendTime": the broker stamps each batch
    compact: bool = False  # cleanup.policy has "compact": keep the latest record per key (compaction.py)
    delete_retention_ms: int = 24 * 3600 * 1000  # how long a tombstone outlives its record timestamp
    min_compaction_lag_ms: int = 0  # a record stays uncompacted at least this long
    min_cleanable_dirty_ratio: float = 0.5  # clean once the uncleaned part is this share of the log

    def __post_init__(self) -> None:
        if self.timestamp_type not in ("CreateTime", "LogAppendTime"):
            raise InvalidConfigError(
                f"message.timestamp.type: must be CreateTime or LogAppendTime (got {self.timestamp_type!r})"
            )
        if self.flush not in ("always", "interval"):
            raise InvalidConfigError(f"flush: must be 'always' or 'interval' (got {self.flush!r})")
        if not 1 <= self.segment_bytes <= MAX_SEGMENT_BYTES:
            raise InvalidConfigError(
                f"segment.bytes: must be between 1 and {MAX_SEGMENT_BYTES} (got {self.segment_bytes})"
            )
        if self.index_interval_bytes < 1:
            raise InvalidConfigError(
                f"index.interval.bytes: must be positive (got {self.index_interval_bytes})"
            )
        for key, value in (
            ("delete.retention.ms", self.delete_retention_ms),
            ("min.compaction.lag.ms", self.min_compaction_lag_ms),
        ):
            if value < 0:
                raise InvalidConfigError(f"{key}: must not be negative (got {value})")
        if not 0.0 <= self.min_cleanable_dirty_ratio <= 1.0:
            raise InvalidConfigError(
                f"min.cleanable.dirty.ratio: must be between 0 and 1 (got {self.min_cleanable_dirty_ratio})"
            )

    @classmethod
    def from_topic_config(cls, configs: dict[str, str], base: LogConfig | None = None) -> LogConfig:
        """Apply Kafka topic config keys over `base` (or the defaults).

        Keys read: segment.bytes, retention.ms, retention.bytes, index.interval.bytes, flush.messages,
        flush.ms, cleanup.policy, max.message.bytes, message.timestamp.type, delete.retention.ms,
        min.compaction.lag.ms, min.cleanable.dirty.ratio. flush.messages=1 or flush.ms=0 mean fsync
        on every append ("always"); any other value of either means "interval" (flush.ms giving the
        interval). cleanup.policy "compact" turns compaction on; without "delete" nothing is deleted
        by time or size (Kafka ignores retention.* on compact-only topics too).

        >>> LogConfig.from_topic_config({"retention.ms": "-1", "flush.messages": "1"}).retention_ms
        -1
        >>> cfg = LogConfig.from_topic_config({"cleanup.policy": "compact"})
        >>> cfg.compact, cfg.retention_ms
        (True, -1)
        """
        cfg = replace(base) if base is not None else cls()
        policies = {p.strip() for p in configs.get("cleanup.policy", "delete").split(",")}
        if not policies <= {"delete", "compact"}:
            raise InvalidConfigError(
                f"cleanup.policy: must be delete, compact or both (got {configs['cleanup.policy']!r})"
            )
        ints = {
            "segment.bytes": "segment_bytes",
            "retention.ms": "retention_ms",
            "retention.bytes": "retention_bytes",
            "index.interval.bytes": "index_interval_bytes",
            "max.message.bytes": "max_message_bytes",
            "delete.retention.ms": "delete_retention_ms",
            "min.compaction.lag.ms": "min_compaction_lag_ms",
        }
        for key, attr in ints.items():
            if key in configs:
                setattr(cfg, attr, _int_config(configs, key))
        cfg.timestamp_type = configs.get("message.timestamp.type", cfg.timestamp_type)
        if "min.cleanable.dirty.ratio" in configs:
            cfg.min_cleanable_dirty_ratio = _float_config(configs, "min.cleanable.dirty.ratio")
        cfg.compact = "compact" in policies
        messages = _int_config(configs, "flush.messages") if "flush.messages" in configs else None
        flush_ms = _int_config(configs, "flush.ms") if "flush.ms" in configs else None
        if messages == 1 or flush_ms == 0:
            cfg.flush = "always"
        elif messages is not None or flush_ms is not None:
            cfg.flush = "interval"
            if flush_ms is not None:
                cfg.flush_interval_ms = flush_ms
        if "delete" not in policies:
            cfg.retention_ms, cfg.retention_bytes = -1, -1
        cfg.__post_init__()
        return cfg


def _float_config(configs: dict[str, str], key: str) -> float:
    return _number_config(configs, key, float, "a number")


def _int_config(configs: dict[str, str], key: str) -> int:
    return _number_config(configs, key, int, "an integer")


def _number_config(configs: dict[str, str], key: str, kind: type, what: str):
    value = configs[key]
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise InvalidConfigError(f"{key}: must be {what} (got {value!r})") from None

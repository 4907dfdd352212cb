"""Moving a consumer group's committed offsets from outside the group: where a stage will start.

The sink's `--rewind` (a full replay), the benchmark's skip to the end (no backlog) and the replay
command's start offsets all come down to one commit made on the group's behalf, written here once.
The group's members must be stopped: a running member commits over it. Must not read or write
records.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Literal

from clients.kafka import make_consumer
from clients.kafka.ranges import topic_partitions

log = logging.getLogger(__name__)

CLIENT_ID = "agentstream-group-offsets"
Partition = tuple[str, int]


def commit_group_offsets(bootstrap_servers: str, group: str, offsets: Mapping[Partition, int]) -> None:
    """Commit `offsets` ((topic, partition) -> the next offset to read) for consumer `group`, without
    joining it: its members start there on their next start. Raises a kafka-python `KafkaError`
    when the broker does not take the commit."""
    if not offsets:
        return
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata

    consumer = make_consumer(bootstrap_servers, CLIENT_ID, group)
    try:
        consumer.commit({TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()})
    finally:
        consumer.close()
    log.info("committed %d partition offsets for group %s", len(offsets), group)


def topic_offsets(
    bootstrap_servers: str, topics: Iterable[str], at: Literal["beginning", "end"]
) -> dict[Partition, int]:
    """The first (`beginning`) or the next-to-be-written (`end`) offset of every partition of
    `topics` now; none for a topic that does not exist."""
    consumer = make_consumer(bootstrap_servers, CLIENT_ID)
    try:
        parts = topic_partitions(consumer, topics)
        if not parts:
            return {}
        found = consumer.beginning_offsets(parts) if at == "beginning" else consumer.end_offsets(parts)
        return {(tp.topic, tp.partition): offset for tp, offset in found.items()}
    finally:
        consumer.close()

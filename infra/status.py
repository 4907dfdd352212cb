"""`agentstream status`: per-stage consumer lag, topic throughput and the DLQ count, read from Kafka
(embedded broker or Apache Kafka alike) plus the supervisor's state file."""

from __future__ import annotations

import time
from dataclasses import dataclass

from schemas.topics import DLQ, TOPICS


@dataclass(frozen=True)
class GroupLag:
    group: str
    topics: tuple[str, ...]
    lag: int


@dataclass(frozen=True)
class StackStatus:
    end_offsets: dict[str, int]  # topic -> total records (sum of end offsets)
    rates: dict[str, float]  # topic -> records/s over the sampling window
    groups: list[GroupLag]
    dlq_count: int


def collect(bootstrap_servers: str, sample_s: float = 1.0) -> StackStatus:
    from kafka import KafkaAdminClient, KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, client_id="agentstream-status")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, client_id="agentstream-status")
    try:
        partitions = _partitions(consumer)
        first = consumer.end_offsets(partitions)
        time.sleep(sample_s)
        second = consumer.end_offsets(partitions)
        starts = consumer.beginning_offsets(partitions)
        groups = [_group_lag(admin, group, second) for group in _group_ids(admin)]
    finally:
        consumer.close()
        admin.close()
    totals = _by_topic(second)
    rates = {t: (totals[t] - _by_topic(first).get(t, 0)) / sample_s for t in totals}
    dlq = sum(second[tp] - starts[tp] for tp in second if tp.topic == DLQ)
    return StackStatus(totals, rates, [g for g in groups if g is not None], dlq)


def _partitions(consumer):
    from kafka import TopicPartition

    out = []
    for topic in TOPICS:
        for p in sorted(consumer.partitions_for_topic(topic) or ()):
            out.append(TopicPartition(topic, p))
    return out


def _group_ids(admin) -> list[str]:
    return sorted(g["group_id"] for g in admin.list_groups())  # kafka-python 3: dicts


def _group_lag(admin, group: str, ends: dict) -> GroupLag | None:
    committed = admin.list_group_offsets(group).get(group, {})
    relevant = {tp: meta.offset for tp, meta in committed.items() if tp in ends and meta.offset >= 0}
    if not relevant:
        return None
    lag = sum(max(0, ends[tp] - offset) for tp, offset in relevant.items())
    return GroupLag(group, tuple(sorted({tp.topic for tp in relevant})), lag)


def _by_topic(offsets: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for tp, offset in offsets.items():
        out[tp.topic] = out.get(tp.topic, 0) + offset
    return out

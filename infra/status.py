"""`agentstream status`: per-stage consumer lag, topic throughput and the DLQ count, read from Kafka
(embedded broker or Apache Kafka alike) plus the supervisor's state file."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from clients.kafka.ranges import topic_partitions
from schemas.topics import DLQ, TOPICS


@dataclass(frozen=True)
class GroupLag:
    group: str
    topics: tuple[str, ...]
    lag: int
    committed: int = 0  # sum of the group's committed offsets: its progress


@dataclass(frozen=True)
class StackStatus:
    end_offsets: dict[str, int]  # topic -> total records (sum of end offsets)
    rates: dict[str, float]  # topic -> records/s over the sampling window
    groups: list[GroupLag]
    dlq_count: int
    group_rates: dict[str, float] = field(default_factory=dict)  # group -> records/s it committed


def collect(bootstrap_servers: str, sample_s: float = 1.0) -> StackStatus:
    from clients.kafka import make_admin, make_consumer

    consumer = make_consumer(bootstrap_servers, "agentstream-status")
    admin = make_admin(bootstrap_servers, "agentstream-status")
    try:
        partitions = topic_partitions(consumer, TOPICS)
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


class StatusSampler:
    """Samples on demand with long-lived clients (the console's overview): each `sample()` reads the
    end offsets and the groups' committed offsets once, and rates come from the previous sample, so
    nothing sleeps and nothing polls while nobody looks. Not thread-safe: one caller at a time."""

    def __init__(self, bootstrap_servers: str):
        self.bootstrap_servers = bootstrap_servers
        self._clients = None
        self._previous: tuple[float, dict[str, int], dict[str, int]] | None = None

    def sample(self) -> StackStatus:
        try:
            return self._sample()
        except Exception:
            self.close()  # a broker restart: connect afresh next time
            raise

    def _sample(self) -> StackStatus:
        consumer, admin = self._connected()
        partitions = topic_partitions(consumer, TOPICS)
        ends = consumer.end_offsets(partitions)
        starts = consumer.beginning_offsets(partitions)
        groups = [_group_lag(admin, group, ends) for group in _group_ids(admin)]
        now, totals = time.monotonic(), _by_topic(ends)
        groups = [g for g in groups if g is not None]
        progress = {g.group: g.committed for g in groups}
        rates: dict[str, float] = {}
        group_rates: dict[str, float] = {}
        if self._previous is not None and now > self._previous[0]:
            then, before, before_groups = self._previous
            rates = _per_second(totals, before, now - then)
            group_rates = _per_second(progress, before_groups, now - then)
        self._previous = (now, totals, progress)
        dlq = sum(ends[tp] - starts[tp] for tp in ends if tp.topic == DLQ)
        return StackStatus(totals, rates, groups, dlq, group_rates)

    def _connected(self):
        if self._clients is None:
            from clients.kafka import make_admin, make_consumer

            consumer = make_consumer(self.bootstrap_servers, "agentstream-console")
            admin = make_admin(self.bootstrap_servers, "agentstream-console")
            self._clients = (consumer, admin)
        return self._clients

    def close(self) -> None:
        if self._clients is not None:
            for client in self._clients:
                try:
                    client.close()
                except Exception:  # closing a client of a broker that is gone
                    pass
            self._clients = None


def _per_second(now: dict[str, int], before: dict[str, int], seconds: float) -> dict[str, float]:
    """
    >>> _per_second({"a": 30, "b": 5}, {"a": 10}, 2.0)
    {'a': 10.0}
    """
    return {k: max(0.0, (v - before[k]) / seconds) for k, v in now.items() if k in before}


def _group_ids(admin) -> list[str]:
    return sorted(g["group_id"] for g in admin.list_groups())  # kafka-python 3: dicts


def _group_lag(admin, group: str, ends: dict) -> GroupLag | None:
    committed = admin.list_group_offsets(group).get(group, {})
    relevant = {tp: meta.offset for tp, meta in committed.items() if tp in ends and meta.offset >= 0}
    if not relevant:
        return None
    lag = sum(max(0, ends[tp] - offset) for tp, offset in relevant.items())
    return GroupLag(group, tuple(sorted({tp.topic for tp in relevant})), lag, sum(relevant.values()))


def _by_topic(offsets: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for tp, offset in offsets.items():
        out[tp.topic] = out.get(tp.topic, 0) + offset
    return out

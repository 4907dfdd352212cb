"""Helpers for the streams integration tests and the streams benchmark: synthetic trajectories,
publishing with kafka-python, reading topics back, and a worker subprocess."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

from schemas.codec import decode, encode, encode_key
from schemas.events import EpisodeEnded, EpisodeStarted, EventBase, StepRecorded

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TOOLS = [
    ("read_file", lambda r: {"file_path": f"/src/m{r.randint(0, 3)}.py"}, "see src/util.py and my_var"),
    ("edit_file", lambda r: {"file_path": "/src/m0.py", "old_string": "a", "new_string": "b"}, "ok"),
    ("edit_file", lambda r: {"file_path": "/src/m0.py", "old_string": "b", "new_string": "a"}, "ok"),
    ("bash", lambda r: {"command": r.choice(["pytest", "python src/util.py", "ls"])}, "1 passed"),
    ("grep", lambda r: {"pattern": r.choice(["foo", "bar"])}, "src/m1.py: foo_bar"),
]


def make_trajectory(tid: str, n_steps: int, rng: random.Random, domain: str = "coding", ended: bool = True):
    """EpisodeStarted, the steps and (optionally) EpisodeEnded of one synthetic trajectory."""
    events: list[EventBase] = [
        EpisodeStarted(
            event_id=f"{tid}:start",
            trajectory_id=tid,
            occurred_at=T0,
            producer="test",
            task_id=f"task-{tid}",
            domain=domain,
            reference_steps=max(1, n_steps - 2),
        )
    ]
    for i in range(n_steps):
        tool, params, output = rng.choice(TOOLS)
        events.append(
            StepRecorded(
                event_id=f"{tid}:step:{i}",
                trajectory_id=tid,
                occurred_at=T0 + timedelta(seconds=i + 1),
                producer="test",
                step_index=i,
                tool=tool,
                params=params(rng),
                observation=output,
            )
        )
    if ended:
        events.append(
            EpisodeEnded(
                event_id=f"{tid}:end",
                trajectory_id=tid,
                occurred_at=T0 + timedelta(seconds=n_steps + 1),
                producer="test",
                success=rng.random() < 0.5,
                tests_passed=rng.randint(0, 4),
                tests_failed=rng.randint(0, 2),
                total_steps=n_steps,
            )
        )
    return events


def interleave(trajectories: list[list[EventBase]], rng: random.Random) -> list[EventBase]:
    """Merge trajectories randomly, keeping each one's own order."""
    queues = [list(t) for t in trajectories]
    out = []
    while queues:
        q = rng.choice(queues)
        out.append(q.pop(0))
        if not q:
            queues.remove(q)
    return out


def producer(bootstrap: str):
    from kafka import KafkaProducer

    return KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_in_flight_requests_per_connection=1
    )


def publish(
    bootstrap: str, topic: str, events: list[EventBase], raw: list[tuple[bytes | None, bytes]] = ()
) -> None:
    prod = producer(bootstrap)
    try:
        for e in events:
            prod.send(topic, key=encode_key(e), value=encode(e))
        for key, value in raw:
            prod.send(topic, key=key, value=value)
        prod.flush(timeout=60)
    finally:
        prod.close()


def read_topic(bootstrap: str, topic: str, timeout_s: float = 2.0) -> list[EventBase]:
    """Every event currently in `topic` (from the beginning), decoded."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=int(timeout_s * 1000)
    )
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        if not parts:
            return []
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        end = consumer.end_offsets(parts)
        out = []
        while any(consumer.position(tp) < end[tp] for tp in parts):
            batch = consumer.poll(timeout_ms=500)
            for records in batch.values():
                out += [decode(r.value) for r in records]
        return out
    finally:
        consumer.close()


def worker_args(bootstrap: str, data_dir: Path, roles: str = "scoring", *extra: str) -> list[str]:
    from tests.support.processes import AGENTSTREAM

    return [
        *AGENTSTREAM,
        "worker",
        "--bootstrap-servers",
        bootstrap,
        "--data-dir",
        str(data_dir),
        "--roles",
        roles,
        *extra,
    ]

"""`policy.updated` events for tests, and publishing them to chosen partitions of `policy.updates`."""

from __future__ import annotations

from datetime import datetime

from clients.kafka import make_producer
from schemas.codec import encode, encode_key
from schemas.events import PolicyUpdated, utc_now
from schemas.ids import new_event_id
from schemas.topics import POLICY_UPDATES


def policy_update(
    version: str, step: int = 0, checkpoint_path: str = "", occurred_at: datetime | None = None
) -> PolicyUpdated:
    return PolicyUpdated(
        event_id=new_event_id(),
        trajectory_id=version,
        occurred_at=occurred_at or utc_now(),
        producer="tests",
        policy_version=version,
        step=step,
        checkpoint_path=checkpoint_path,
    )


def publish_updates(bootstrap: str, events: list[PolicyUpdated], partitions: list[int] | None = None) -> None:
    """Publish `events` in the order given, event i to `partitions[i]` (None: the key decides)."""
    producer = make_producer(bootstrap, "tests-policy-updates")
    try:
        for i, event in enumerate(events):
            partition = partitions[i] if partitions is not None else None
            producer.send(
                POLICY_UPDATES, key=encode_key(event), value=encode(event), partition=partition
            ).get(30)
    finally:
        producer.close()


def publish_raw(bootstrap: str, value: bytes, partition: int = 0) -> None:
    """One record of any bytes on `policy.updates` (a malformed or foreign record)."""
    producer = make_producer(bootstrap, "tests-policy-updates")
    try:
        producer.send(POLICY_UPDATES, key=b"junk", value=value, partition=partition).get(30)
    finally:
        producer.close()

"""Our own event JSON Lines: one `agent.events` event per line (episode.started / step.recorded /
episode.ended), as the codec encodes them (e.g. an export of the topic, or events written by hand).

Events are validated with the codec (`schemas.codec.validate`, tolerant read) and published as they
are: their ids, trajectory ids and timestamps are kept, so re-ingesting an export is idempotent.
A line that is not a valid event, or an event type that does not belong on `agent.events`, is
rejected with its line number; the other lines still land. `--domain/--agent/--model` do not apply.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from producers.adapters.contract import Document, Rejection
from producers.adapters.fields import describe
from producers.errors import AdapterError
from schemas.codec import validate
from schemas.errors import DecodeError
from schemas.events import EventBase
from schemas.topics import AGENT_EVENTS, TOPICS

name = "jsonl"

_AGENT_TYPES = set(TOPICS[AGENT_EVENTS].event_types)


@dataclass(frozen=True)
class ReadyEvents:
    """Events that need no conversion (the adapter yields these instead of EpisodeDrafts)."""

    events: list[EventBase]


def _looks_like_event(value: object) -> bool:
    return isinstance(value, dict) and isinstance(value.get("type"), str) and "trajectory_id" in value


def detect(doc: Document) -> float:
    items = doc.items
    if not items or not _looks_like_event(items[0]):
        return 0.0
    return 1.0 if sum(map(_looks_like_event, items)) * 2 > len(items) else 0.5


def parse(doc: Document) -> Iterator[ReadyEvents | Rejection]:
    items = doc.items
    if not items or not any(map(_looks_like_event, items)):
        raise AdapterError(
            f"{doc.path}: not agentstream event JSON Lines: expected one event per line with "
            f"'type' and 'trajectory_id', got {describe(items[0] if items else None)}"
        )
    labels = (
        [f"line {n}" for n in doc.lines] if doc.kind == "jsonl" else [f"item {i}" for i in range(len(items))]
    )
    events: list[EventBase] = []
    for label, raw in zip(labels, items, strict=True):
        try:
            event = validate(raw, strict=False)
        except DecodeError as exc:
            yield Rejection(f"{doc.path}: {label}", f"not a valid event: {exc}", raw)
            continue
        if event.type not in _AGENT_TYPES:
            yield Rejection(
                f"{doc.path}: {label}",
                f"type: {event.type!r} does not belong on {AGENT_EVENTS} ({sorted(_AGENT_TYPES)})",
                raw,
            )
            continue
        events.append(event)
    if events:
        yield ReadyEvents(events)

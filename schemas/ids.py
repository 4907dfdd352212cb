"""Deterministic event ids: the same inputs give the same id, so replays create no new facts."""

from __future__ import annotations

import uuid

# Fixed namespace for agentstream ids (uuid5 of the project name under the URL namespace).
NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://agentstream.dev/events")


def derived_event_id(event_type: str, *parts: object) -> str:
    """A stable id for an event derived from `parts` (e.g. the source event id and a logic version).

    >>> a = derived_event_id("reward.rule.step", "abc", "rules-1")
    >>> a == derived_event_id("reward.rule.step", "abc", "rules-1")
    True
    >>> a == derived_event_id("reward.rule.step", "abc", "rules-2")
    False
    """
    key = "\x1f".join([event_type, *(str(p) for p in parts)])
    return str(uuid.uuid5(NAMESPACE, key))


def new_event_id() -> str:
    """A random id, for events that have no natural identity."""
    return str(uuid.uuid4())

"""Which policy is current: the one definition every component uses (pure; no I/O).

The current policy is the newest `policy.updated` event (schemas.events.PolicyUpdated) by the
order below, over every event on `policy.updates` (all partitions), whatever order they were
published or read in. `clients.current_policy` reads the topic and applies it; nothing else decides.

Version identifiers (`PolicyUpdated.policy_version`). The executor names the policy after its n-th
training step `v<n>` (`base` is the model before any update); other names are accepted:
- `base` is number 0;
- a name ending in decimal digits has those digits as its number (`v12` -> 12, `run3-v12` -> 12,
  `7` -> 7, `v007` -> 7);
- anything else (`latest`, `v1b`, ``) has no number: an unknown-format version.

Order, compared in turn until one differs (a total order, so every reader picks the same event):
1. numbered versions are newer than unknown-format ones (an unknown-format version is current only
   while no numbered version exists);
2. the higher number;
3. the higher training `step`;
4. the later `occurred_at`;
5. the greater `policy_version` string, then the greater `event_id` (a republished duplicate of a
   version is the same version: either event is fine, but everyone must pick the same one).

Arrival order and offsets never count: a `v3` published after `v5` is not current.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from schemas.events import PolicyUpdated

BASE_VERSION = "base"  # the policy before any update: version number 0

_TRAILING_DIGITS = re.compile(r"(\d+)$")


def version_number(version: str | None) -> int | None:
    """The number a policy version is ordered by: `base` -> 0, trailing digits -> their value,
    anything else (unknown format, empty, None) -> None.

    >>> version_number("v12"), version_number("run3-v007"), version_number("base"), version_number("v1b")
    (12, 7, 0, None)
    """
    if version == BASE_VERSION:
        return 0
    match = _TRAILING_DIGITS.search(version or "")
    return int(match.group(1)) if match else None


def order_key(event: PolicyUpdated) -> tuple:
    """The key the order above compares: the newest event has the greatest key."""
    number = version_number(event.policy_version)
    return (
        number is not None,
        number if number is not None else -1,
        event.step,
        event.occurred_at,
        event.policy_version,
        event.event_id,
    )


def newer(current: PolicyUpdated | None, candidate: PolicyUpdated) -> PolicyUpdated:
    """The newer of two `policy.updated` events (`candidate` when there is no `current` yet).

    Folding a topic's events with it gives `current_policy` in any reading order.
    """
    if current is None or order_key(candidate) > order_key(current):
        return candidate
    return current


def current_policy(events: Iterable[PolicyUpdated]) -> PolicyUpdated | None:
    """The current policy among `events` (None when there is none).

    >>> from schemas.events import utc_now
    >>> def update(version, step=0):
    ...     return PolicyUpdated(event_id=version, trajectory_id=version, occurred_at=utc_now(),
    ...                          producer="doc", policy_version=version, step=step)
    >>> current_policy([update("v2"), update("v10"), update("v9")]).policy_version
    'v10'
    >>> current_policy([update("latest", step=50), update("base")]).policy_version
    'base'
    >>> current_policy([]) is None
    True
    """
    found = None
    for event in events:
        found = newer(found, event)
    return found

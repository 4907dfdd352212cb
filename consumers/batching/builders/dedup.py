"""Content-hash dedup: two trajectories with the same task and the same steps are one example.

The hash covers what a trainer would see (task text, each step's thought, tool, params, observation,
error), not ids, timestamps or rewards, so a re-ingested copy of a log is recognised.
"""

from __future__ import annotations

import hashlib

import orjson

from schemas.events import TrajectoryScored


def content_hash(trajectory: TrajectoryScored) -> str:
    """sha256 hex of the trajectory's trainable content.

    >>> from schemas.events import TrajectoryScored
    >>> a = TrajectoryScored(event_id="e1", trajectory_id="a", occurred_at="2026-01-01T00:00:00Z",
    ...     producer="p", task_id="k", task="do it")
    >>> content_hash(a) == content_hash(a.model_copy(update={"trajectory_id": "b", "total_reward": 1.0}))
    True
    """
    steps = [
        [s.step_index, s.thought, s.tool, s.params, s.observation, s.error]
        for s in sorted(trajectory.steps, key=lambda s: s.step_index)
    ]
    body = orjson.dumps([trajectory.task_id, trajectory.task, steps], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(body).hexdigest()


class Deduplicator:
    """Remembers content hashes; `seen_before(t)` is True for the second and later copies."""

    def __init__(self, known: set[str] | None = None):
        self.known: set[str] = set(known or ())

    def seen_before(self, trajectory: TrajectoryScored) -> bool:
        digest = content_hash(trajectory)
        if digest in self.known:
            return True
        self.known.add(digest)
        return False

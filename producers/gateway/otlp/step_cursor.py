"""The gateway's OTLP step cursor: which step index each span of a trace was given, in memory
(`StepCursor`) and on disk (`DurableStepCursor`).

A span's step index cannot be computed from the span alone (docs/otlp.md, "Ordering"), so the gateway
hands indexes out and must give a span the same one again, also after a restart: otherwise a resent
span would be the same event under two indexes. `DurableStepCursor` keeps each trace's assignments in
SQLite (WAL, `synchronous=FULL`) and writes the ones a request made before that request's events are
published: an index on the broker is always on disk first. Acknowledgements ride along with the next
write (losing the last few only means a resend publishes identical events again, which every store
deduplicates). Traces not touched for `keep_s` are pruned when the gateway starts.

One gateway per cursor file: two gateways taking the same traces each need the other's assignments,
so run one gateway per data directory, or send a trace's spans to one of them (e.g. by trace id).
"""

from __future__ import annotations

import sqlite3
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from schemas.events import EventBase, StepRecorded

KEEP_S = 7 * 24 * 3600.0


# --- step indexes ----------------------------------------------------------------------------------


@dataclass
class TraceCursor:
    """What the gateway handed out for one trace: span id -> step index; the step count the episode
    ended with (None: its root span has not arrived; it grows when a step span comes after the root);
    the model of its lowest-index LLM step; the first `episode.ended` (JSON), which a late step's
    new `episode.ended` repeats with the larger count."""

    indexes: dict[str, int] = field(default_factory=dict)
    ended_with: int | None = None
    root: str | None = None  # the span id of the root that ended the episode
    model: tuple[int, str] | None = None
    acked: set[int] = field(default_factory=set)  # what the broker acknowledged: see `_ack_key`
    first_end: dict | None = None


class StepCursor:
    """Step indexes per trace, for the traces seen most recently (at most `max_traces`)."""

    def __init__(self, max_traces: int = 50_000):  # ~150 bytes per step: ~150 MB for 20-step traces
        self.max_traces = max_traces
        self.traces: OrderedDict[str, TraceCursor] = OrderedDict()
        self.touched: set[str] = set()  # traces changed since the last `save`

    def trace(self, trace_id: str) -> TraceCursor:
        cursor = self.traces.pop(trace_id, None) or self._load(trace_id) or TraceCursor()
        self.traces[trace_id] = cursor  # most recently used last
        self.touched.add(trace_id)
        while len(self.traces) > self.max_traces:
            self.traces.popitem(last=False)
        return cursor

    def _load(self, trace_id: str) -> TraceCursor | None:
        """A trace this process no longer holds (a durable cursor reads it back)."""
        return None

    def save(self) -> None:
        """Keep what changed (a durable cursor writes it down before the events are published)."""
        self.touched.clear()

    def unacknowledged(self, events: list[EventBase]) -> list[EventBase]:
        """The events not acknowledged before (a resent batch adds nothing to the topic)."""
        return [e for e in events if _ack_key(e) not in self.trace(e.trajectory_id).acked]

    def acknowledged(self, events: list[EventBase]) -> None:
        for event in events:
            self.trace(event.trajectory_id).acked.add(_ack_key(event))


def _ack_key(event: EventBase) -> int:
    """An acknowledged event of a trace, as a small int: its step index, -1 started, -2 - N the
    episode's end with N steps (one event per slot: the cursor hands out each index once, and an
    episode ends once per step count)."""
    if isinstance(event, StepRecorded):
        return event.step_index
    if event.type == "episode.started":
        return -1
    return -2 - (getattr(event, "total_steps", None) or 0)


class DurableStepCursor(StepCursor):
    """A `StepCursor` whose traces live in SQLite at `path` as well as in memory."""

    def __init__(self, path: str | Path, max_traces: int = 50_000, keep_s: float = KEEP_S):
        super().__init__(max_traces)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS traces (trace_id TEXT PRIMARY KEY, state BLOB NOT NULL, updated REAL)"
        )
        self._db.execute("DELETE FROM traces WHERE updated < ?", (time.time() - keep_s,))

    def _load(self, trace_id: str) -> TraceCursor | None:
        row = self._db.execute("SELECT state FROM traces WHERE trace_id = ?", (trace_id,)).fetchone()
        return trace_cursor(row[0]) if row else None

    def save(self) -> None:
        now = time.time()
        rows = [(t, cursor_state(self.traces[t]), now) for t in self.touched if t in self.traces]
        if rows:
            with self._db:  # one transaction, one fsync
                self._db.executemany("INSERT OR REPLACE INTO traces VALUES (?, ?, ?)", rows)
        self.touched.clear()

    def close(self) -> None:
        self.save()
        self._db.close()


def cursor_state(trace: TraceCursor) -> bytes:
    """A trace's cursor as JSON (what a durable cursor stores).

    >>> t = TraceCursor({"ab": 0}, 1, "cd", (0, "m"), {0, -1}, {"total_steps": 1})
    >>> trace_cursor(cursor_state(t)) == t
    True
    """
    return orjson.dumps(
        {"indexes": trace.indexes, "ended_with": trace.ended_with, "root": trace.root,
         "model": list(trace.model) if trace.model else None, "acked": sorted(trace.acked),
         "first_end": trace.first_end}
    )  # fmt: skip


def trace_cursor(state: bytes | str) -> TraceCursor:
    """The inverse of `cursor_state`."""
    data = orjson.loads(state)
    model = data.get("model")
    return TraceCursor(
        dict(data["indexes"]), data.get("ended_with"), data.get("root"),
        (int(model[0]), str(model[1])) if model else None, set(data.get("acked", ())),
        data.get("first_end"),
    )  # fmt: skip

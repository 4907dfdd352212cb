"""Per-trajectory judge state as plain JSON-able dicts (what the faust table stores), and the
views the prompt is rendered from. Pure.

A record: `decided` (episode.started seen), `rule` (the JudgeRule as a dict, or None: not judged),
task / domain / group_id / expected group size, `steps` (kept for context or the whole trajectory),
`pending` (step indices waiting to fill a batch), `seen` (step indices, for duplicates), `ended`,
`done` (judged whole, or its steps flushed at the end).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, MutableMapping

import orjson

from schemas.events import StepRecorded
from streams.judge.prompt import StepView, TrajectoryView
from streams.judge.selection import JudgeRule


def new_record() -> dict:
    return {"decided": False, "rule": None, "steps": [], "pending": [], "ended": None}


def rule_of(rec: dict) -> JudgeRule | None:
    return JudgeRule.model_validate(rec["rule"]) if rec.get("rule") else None


def as_int(value: object) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def step_dict(step: StepRecorded, observation_chars: int) -> dict:
    return {
        "i": step.step_index,
        "eid": step.event_id,
        "tool": step.tool,
        "params": step.params,
        "thought": step.thought[:4000],
        "observation": step.observation[: observation_chars + 1000],
        "exit_code": step.exit_code,
        "error": step.error,
    }


def step_view(s: dict) -> StepView:
    return StepView(
        step_index=s["i"],
        tool=s.get("tool", ""),
        params=s.get("params") or {},
        thought=s.get("thought", ""),
        observation=s.get("observation", ""),
        exit_code=s.get("exit_code"),
        error=s.get("error"),
    )


def trajectory_view(label: str, steps: list[dict], ended: dict | None) -> TrajectoryView:
    ordered = [step_view(s) for s in sorted(steps, key=lambda s: s["i"])]
    ended = ended or {}
    return TrajectoryView(label, ordered, ended.get("success"), ended.get("score"))


def group_member(tid: str, rec: dict, observation_budget: int) -> dict:
    """An ended trajectory for the group topic; observations cut to what the group prompt shows,
    so a long trajectory stays well under the broker's message size limit."""
    per_step = max(200, observation_budget // max(1, len(rec["steps"])))
    steps = [{**s, "observation": s.get("observation", "")[: per_step + 100]} for s in rec["steps"]]
    return {
        "group_id": rec["group_id"],
        "trajectory_id": tid,
        "task": rec.get("task", ""),
        "domain": rec.get("domain", "generic"),
        "rule": rec["rule"],
        "expected": rec.get("expected"),
        "steps": steps,
        "ended": rec["ended"],
    }


_DELETED = object()


class StagedState(MutableMapping):
    """Writes are held here until the outputs they lead to are published: a worker killed in
    between replays its input against the old state, so nothing is lost (at-least-once). Reads see
    staged values first; values read from the durable mapping are copies, so mutating a record
    never changes durable state behind the caller's back."""

    def __init__(self, durable: MutableMapping | None = None):
        self.durable: MutableMapping = {} if durable is None else durable
        self.staged: dict = {}

    def __getitem__(self, key):
        if key in self.staged:
            value = self.staged[key]
            if value is _DELETED:
                raise KeyError(key)
            return value
        return copy.deepcopy(self.durable[key])

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def __setitem__(self, key, value) -> None:
        self.staged[key] = value

    def __delitem__(self, key) -> None:
        self.staged[key] = _DELETED

    def __iter__(self) -> Iterator:
        keys = dict.fromkeys([*self.durable.keys(), *self.staged.keys()])
        return (k for k in keys if self.staged.get(k) is not _DELETED)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def take(self) -> dict:
        """The staged writes (None = deleted), cleared here."""
        staged, self.staged = self.staged, {}
        return {k: (None if v is _DELETED else v) for k, v in staged.items()}

    def commit(self) -> None:
        """Apply the staged writes to the durable mapping directly (no changelog to wait for)."""
        for key, value in self.take().items():
            if value is None:
                self.durable.pop(key, None)
            else:
                self.durable[key] = value

    def discard(self) -> None:
        self.staged.clear()


def raw_updates(updates: dict) -> dict[bytes, bytes | None]:
    """Staged writes (str keys, dict values, None = deleted) as a table's raw keys and values."""
    return {key.encode(): None if value is None else orjson.dumps(value) for key, value in updates.items()}


class BytesKeyed(MutableMapping):
    """A str-keyed, dict-valued view of a table store of raw bytes: keys utf-8 (so the changelog
    key bytes equal the source topic's key bytes, hence the same partition, and recovered keys read
    back), values orjson."""

    def __init__(self, store: MutableMapping):
        self.store = store

    def __getitem__(self, key: str):
        return orjson.loads(self.store[key.encode()])

    def __setitem__(self, key: str, value) -> None:
        self.store[key.encode()] = orjson.dumps(value)

    def __delitem__(self, key: str) -> None:
        del self.store[key.encode()]

    def __iter__(self) -> Iterator[str]:
        return (k.decode() if isinstance(k, bytes) else k for k in list(self.store.keys()))

    def __len__(self) -> int:
        return len(self.store)

    def get(self, key: str, default=None):
        raw = self.store.get(key.encode())
        return default if raw is None else orjson.loads(raw)

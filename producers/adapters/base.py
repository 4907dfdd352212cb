"""The adapter contract and the pure conversion from a parsed log episode to contract events.

An adapter (one module per log format) turns a loaded `Document` into `EpisodeDraft`s (or
`Rejection`s for records it cannot use) with `parse(doc)`, and says how sure it is that a document
is its format with `detect(doc) -> float` (0 = no, 1 = certain). `build_events` then turns a draft
into `episode.started` + one `step.recorded` per agent action + `episode.ended`, with ids that depend
only on the format, the file's bytes and the episode's place in the file, so ingesting the same file
twice yields the same event ids.

Timestamps: a step carries the log's own timestamp when the log has one. When it does not, the
timestamp is derived deterministically from the file's modification time plus the step index (in
milliseconds), and `metadata.timestamps` says which ("log", "derived_from_mtime" or "partial").

This module does no I/O: reading files and publishing are in `ingest.py`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import orjson

from producers.errors import AdapterError
from schemas.events import EpisodeEnded, EpisodeStarted, EventBase, StepRecorded
from schemas.ids import derived_event_id


@dataclass(frozen=True)
class Document:
    """One input file, read and JSON-decoded once.

    `kind` is "json" (the whole file is one JSON value, in `value`) or "jsonl" (one JSON value per
    non-empty line, in `records`, with their 1-based line numbers in `lines`).
    """

    path: Path
    data: bytes
    sha256: str
    mtime: datetime
    kind: str
    value: Any = None
    records: tuple[Any, ...] = ()
    lines: tuple[int, ...] = ()

    @property
    def items(self) -> list[Any]:
        """The JSON values of the file: the JSONL records, or a top-level array's elements, or [value]."""
        if self.kind == "jsonl":
            return list(self.records)
        if isinstance(self.value, list):
            return list(self.value)
        return [self.value]

    @property
    def stem(self) -> str:
        """The file name without its log suffixes (`x.traj.json` -> `x`)."""
        name = self.path.name
        for suffix in (".traj.json", ".traj", ".jsonl", ".json"):
            if name.endswith(suffix) and len(name) > len(suffix):
                return name[: -len(suffix)]
        return self.path.stem


def load_document(path: Path, data: bytes, mtime: datetime) -> Document:
    """Decode `data` as one JSON value, or else as JSON Lines. Raises AdapterError naming the line."""
    digest = hashlib.sha256(data).hexdigest()
    if not data.strip():
        raise AdapterError(f"{path}: the file is empty")
    try:
        return Document(path, data, digest, mtime, "json", value=orjson.loads(data))
    except orjson.JSONDecodeError as whole_error:
        records, lines = [], []
        text_lines = data.split(b"\n")
        if len([ln for ln in text_lines if ln.strip()]) < 2:
            raise AdapterError(f"{path}: not valid JSON: {whole_error}") from None
        for number, line in enumerate(text_lines, start=1):
            if not line.strip():
                continue
            try:
                records.append(orjson.loads(line))
            except orjson.JSONDecodeError as exc:
                raise AdapterError(
                    f"{path}: line {number}: not valid JSON ({exc}); the file is neither JSON nor JSON Lines"
                ) from None
            lines.append(number)
        return Document(path, data, digest, mtime, "jsonl", records=tuple(records), lines=tuple(lines))


@dataclass
class StepDraft:
    """One agent action and what came back, as read from a log."""

    tool: str
    params: dict[str, Any] = field(default_factory=dict)
    thought: str = ""
    observation: str = ""
    exit_code: int | None = None
    error: str | None = None
    timestamp: datetime | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    model: str = ""


@dataclass
class EpisodeDraft:
    """One episode as read from a log, before ids and timestamps are assigned.

    `key` identifies the episode inside its file (e.g. "0", or a line number for multi-episode
    files); with the format and the file's hash it makes the trajectory id.
    `outcome_source` says where `success`/`score` came from (e.g. "info.exit_status"), or "unknown"
    when the log states no outcome (then success is False by convention and score is None).
    """

    key: str
    task_id: str
    task: str = ""
    domain: str = "generic"
    agent: str = ""
    model: str = ""
    steps: list[StepDraft] = field(default_factory=list)
    success: bool = False
    score: float | None = None
    outcome_source: str = "unknown"
    tests_passed: int | None = None
    tests_failed: int | None = None
    terminated: bool = True
    truncated: bool = False
    error: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rejection:
    """A record inside a file that could not be converted (the rest of the file still lands).

    `record` is the rejected JSON value when there is one (it becomes the dead letter's payload).
    """

    where: str
    reason: str
    record: Any = None


@dataclass(frozen=True)
class Overrides:
    """Values given on the command line that replace what the log says (empty = keep the log's)."""

    domain: str = ""
    agent: str = ""
    model: str = ""


class Adapter(Protocol):
    """One log format. `name` is what `--format` accepts."""

    name: str

    def detect(self, doc: Document) -> float: ...

    def parse(self, doc: Document) -> Iterator[EpisodeDraft | Rejection]: ...


# --- small pure helpers shared by the adapters --------------------------------------------------------


def parse_timestamp(value: Any) -> tuple[datetime | None, bool]:
    """A log timestamp as an aware UTC datetime, and whether it was naive (then read as UTC).

    Accepts ISO-8601 strings (with or without zone, 'Z' allowed) and unix seconds (or milliseconds).

    >>> parse_timestamp("2025-01-27T22:44:56.900854")
    (datetime.datetime(2025, 1, 27, 22, 44, 56, 900854, tzinfo=datetime.timezone.utc), True)
    >>> parse_timestamp(1706000000.5)[0].isoformat()
    '2024-01-23T08:53:20.500000+00:00'
    """
    if isinstance(value, bool) or value is None:
        return None, False
    if isinstance(value, int | float):
        seconds = value / 1000.0 if value > 1e11 else float(value)
        try:
            return datetime.fromtimestamp(seconds, UTC), False
        except (OverflowError, OSError, ValueError):
            return None, False
    if isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None, False
        if parsed.tzinfo is None:
            return parsed.replace(tzinfo=UTC), True
        return parsed.astimezone(UTC), False
    return None, False


def text_of(content: Any) -> str:
    """Plain text of a chat `content`: a string, or a list of parts/blocks (text kept, others named).

    >>> text_of([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}, "b"])
    'a\\n[image_url]\\nb'
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part for part in (_part_text(p) for p in content) if part)
    if isinstance(content, dict):
        return _part_text(content)
    return str(content)


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return str(part)
    if isinstance(part.get("text"), str):
        return part["text"]
    if "content" in part:
        return text_of(part["content"])
    return f"[{part.get('type', 'part')}]"


def json_args(raw: Any) -> tuple[dict[str, Any], str | None]:
    """Tool-call arguments as a dict: JSON strings are decoded. Returns (params, error or None).

    >>> json_args('{"command": "ls"}')
    ({'command': 'ls'}, None)
    >>> json_args('{"command": ')[1].startswith("arguments are not valid JSON")
    True
    """
    if raw is None or raw == "":
        return {}, None
    if isinstance(raw, dict):
        return dict(raw), None
    if isinstance(raw, str):
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return {"arguments": raw}, f"arguments are not valid JSON: {exc}"
        if isinstance(value, dict):
            return value, None
        return {"arguments": value}, None
    return {"arguments": raw}, None


def as_int(value: Any) -> int | None:
    """An int from a log field (ints, integral floats, digit strings); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def non_negative(value: Any) -> int | None:
    number = as_int(value)
    return number if number is not None and number >= 0 else None


def describe(value: Any) -> str:
    """A short description of a JSON value for error messages: its type and top-level keys."""
    if isinstance(value, dict):
        keys = ", ".join(sorted(map(str, value))[:12])
        return f"an object with keys [{keys}]"
    if isinstance(value, list):
        return f"an array of {len(value)} items"
    if value is None:
        return "nothing (null or missing)"
    return f"a {type(value).__name__} ({value!r:.40})"


def shape_of(doc: Document) -> str:
    """What the file holds, for 'expected X, got Y' messages."""
    if doc.kind == "json":
        return describe(doc.value)
    return f"JSON Lines whose first record is {describe(doc.records[0])}"


# --- draft -> events ------------------------------------------------------------------------------


def trajectory_id_for(format_name: str, doc: Document, key: str) -> str:
    """The trajectory id of episode `key` of `doc`: stable across re-ingestion of the same bytes."""
    return derived_event_id("ingest.trajectory", format_name, doc.sha256, key)


def build_events(
    draft: EpisodeDraft, doc: Document, format_name: str, overrides: Overrides = Overrides()
) -> list[EventBase]:
    """episode.started + step.recorded per step + episode.ended for one draft (pure)."""
    trajectory_id = trajectory_id_for(format_name, doc, draft.key)
    stamps, timestamp_origin = _step_times(draft, doc.mtime)
    producer = f"ingest/{format_name}"
    envelope = {"trajectory_id": trajectory_id, "producer": producer}
    model = overrides.model or draft.model
    metadata = {
        **draft.metadata,
        "source_path": str(doc.path),
        "source_format": format_name,
        "source_sha256": doc.sha256,
        "source_episode": draft.key,
        "timestamps": timestamp_origin,
        "outcome_source": draft.outcome_source,
    }
    started = EpisodeStarted(
        event_id=derived_event_id("episode.started", trajectory_id),
        occurred_at=stamps[0],
        task_id=draft.task_id,
        task=draft.task,
        domain=overrides.domain or draft.domain,
        agent=overrides.agent or draft.agent,
        model=model,
        metadata=metadata,
        **envelope,
    )
    steps = [
        _step_event(index, step, stamps[index + 1], model, envelope) for index, step in enumerate(draft.steps)
    ]
    ended = EpisodeEnded(
        event_id=derived_event_id("episode.ended", trajectory_id),
        occurred_at=stamps[-1],
        success=draft.success,
        score=draft.score,
        tests_passed=draft.tests_passed,
        tests_failed=draft.tests_failed,
        terminated=draft.terminated,
        truncated=draft.truncated,
        total_steps=len(draft.steps),
        error=draft.error,
        input_tokens=draft.input_tokens,
        output_tokens=draft.output_tokens,
        cost_usd=draft.cost_usd,
        outcome_source=draft.outcome_source,
        **envelope,
    )
    return [started, *steps, ended]


def _step_event(index: int, step: StepDraft, when: datetime, model: str, envelope: dict) -> StepRecorded:
    return StepRecorded(
        event_id=derived_event_id("step.recorded", envelope["trajectory_id"], index),
        occurred_at=when,
        step_index=index,
        thought=step.thought,
        tool=step.tool,
        params=_jsonable(step.params),
        observation=step.observation,
        exit_code=step.exit_code,
        error=step.error,
        model=step.model or model,
        input_tokens=non_negative(step.input_tokens),
        output_tokens=non_negative(step.output_tokens),
        **envelope,
    )


def _jsonable(params: dict[str, Any]) -> dict[str, Any]:
    """Params as plain JSON values (logs can hold anything orjson can read, which is JSON already)."""
    return orjson.loads(orjson.dumps(params, default=str))


def _step_times(draft: EpisodeDraft, mtime: datetime) -> tuple[list[datetime], str]:
    """Times for [start, step 0..n-1, end] and where they came from.

    Log timestamps are used where present; a missing one is the previous time + 1 ms (or, with no
    earlier time at all, the file's mtime + index ms), so the sequence is deterministic.
    """
    logged = [draft.started_at, *(s.timestamp for s in draft.steps), draft.ended_at]
    known = sum(1 for t in logged if t is not None)
    if known == 0:
        return [mtime + timedelta(milliseconds=i) for i in range(len(logged))], "derived_from_mtime"
    first_known = next(t for t in logged if t is not None)
    out: list[datetime] = []
    for i, value in enumerate(logged):
        if value is not None:
            out.append(value)
        elif out:
            out.append(out[-1] + timedelta(milliseconds=1))
        else:
            out.append(first_known - timedelta(milliseconds=len(logged) - i))
    step_known = all(s.timestamp is not None for s in draft.steps)
    return out, "log" if step_known else "partial"


def count_steps(events: Iterable[EventBase]) -> int:
    return sum(1 for e in events if e.type == "step.recorded")


def chat_episodes(doc, is_message: Callable[[Any], bool]) -> list[tuple[str, dict, str]]:
    """(key, record with `messages`, where) per episode of a chat-transcript file: one record, a bare
    list of messages, or a list / JSON Lines of records; [] when the file is not such a transcript.
    Shared by the OpenAI and Anthropic transcript adapters, which differ only in what a message is."""

    def is_record(value: Any) -> bool:
        messages = value.get("messages") if isinstance(value, dict) else None
        return isinstance(messages, list) and bool(messages) and all(is_message(m) for m in messages)

    items = doc.items
    if doc.kind == "json" and isinstance(doc.value, dict):
        return [("0", doc.value, "$")] if is_record(doc.value) else []
    if items and all(is_message(m) for m in items):
        return [("0", {"messages": items}, "$")]
    if items and all(is_record(r) for r in items):
        lines = doc.lines if doc.kind == "jsonl" else range(len(items))
        label = "line" if doc.kind == "jsonl" else "item"
        return [(str(i), r, f"{label} {n}") for i, (r, n) in enumerate(zip(items, lines, strict=True))]
    return []


def apply_chat_outcome(draft: EpisodeDraft, record: dict, meta: dict) -> None:
    """Explicit outcome fields only: `success` (bool) and `score` (0..1), on the record or its metadata."""
    for source, holder in (("record", record), ("metadata", meta)):
        if isinstance(holder.get("success"), bool):
            draft.success = holder["success"]
            draft.outcome_source = f"{source}.success"
        score = holder.get("score")
        if isinstance(score, int | float) and not isinstance(score, bool) and 0.0 <= score <= 1.0:
            draft.score = float(score)
            if draft.outcome_source == "unknown":
                draft.outcome_source = f"{source}.score"
    if draft.outcome_source == "unknown":
        draft.terminated = False


def sum_step_tokens(draft: EpisodeDraft) -> None:
    """The episode's token counts as the sum over its steps, when any step has them."""
    step_tokens = [s for s in draft.steps if s.input_tokens is not None]
    if step_tokens:
        draft.input_tokens = sum(s.input_tokens or 0 for s in step_tokens)
        draft.output_tokens = sum(s.output_tokens or 0 for s in step_tokens)


def chat_task_id(doc, key: str, record: dict, meta: dict, multi: bool) -> str:
    """A chat record's task id: stated on the record or its metadata, else named after the file
    (and the record's key when the file holds several)."""
    stated = record.get("task_id") or meta.get("task_id") or record.get("id")
    return str(stated or (f"{doc.stem}-{key}" if multi else doc.stem))


def chat_drafts(doc, episodes: list[tuple[str, dict, str]], build) -> Iterator[EpisodeDraft | Rejection]:
    """`build(doc, key, record, multi)` per chat record; a record it cannot convert is a rejection
    (the rest of the file still lands)."""
    for key, record, where in episodes:
        try:
            yield build(doc, key, record, multi=len(episodes) > 1)
        except AdapterError as exc:
            yield Rejection(f"{doc.path}: {where}", str(exc), record)

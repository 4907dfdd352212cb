"""The adapter contract: what an adapter reads (`Document`, a file loaded and JSON-decoded once
by `load_document`), what it yields (`EpisodeDraft`s with their `StepDraft`s, or `Rejection`s for
records it cannot use) and its shape (`Adapter`: `detect(doc) -> float`, 0 = no, 1 = certain, and
`parse(doc)`).

Drafts become contract events in events.py; the helpers the formats share to read log fields are in
fields.py, and those of the chat-transcript formats in chat_transcripts.py. No I/O here: reading
files and publishing are in `ingest.py`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import orjson

from producers.errors import AdapterError


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


class Adapter(Protocol):
    """One log format. `name` is what `--format` accepts."""

    name: str

    def detect(self, doc: Document) -> float: ...

    def parse(self, doc: Document) -> Iterator[EpisodeDraft | Rejection]: ...

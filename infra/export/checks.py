"""The validator behind `agentstream export --validate`: rows by split in, problems out. Pure.

Checks, each problem naming the split, the row (0-based, in that split's file order) and the reason:
- schema: the kind's TRL columns are present and well-formed (SFT `messages`; DPO `prompt`,
  `chosen`, `rejected`, conversational or all text; GRPO `prompt`), every message a dict with a
  known `role`, every row a `task_id`;
- empty: an empty conversation or text, or a system / user / assistant message with no content
  and no tool call (a `tool` turn may be empty: a tool that printed nothing is an observation);
- leak: a task whose rows are in more than one split (reported on the rows of the later splits);
- duplicate: a row whose training content (the kind's TRL columns) equals an earlier row's, in
  the same split or another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from infra.export.splits import SPLITS

Row = dict[str, Any]
ROLES = frozenset({"system", "user", "assistant", "tool"})
REQUIRED: dict[str, tuple[str, ...]] = {
    "sft": ("messages",),
    "dpo": ("prompt", "chosen", "rejected"),
    "dpo_step": ("prompt", "chosen", "rejected"),
    "grpo": ("prompt",),
}
CONTENT: dict[str, tuple[str, ...]] = {
    "sft": ("messages",),
    "dpo": ("prompt", "chosen", "rejected"),
    "dpo_step": ("prompt", "chosen", "rejected"),
    "grpo": ("prompt", "completion", "input_ids"),
}
"""The columns a trainer learns from: two rows equal on these are duplicates."""


@dataclass(frozen=True)
class Problem:
    split: str
    row: int
    reason: str

    def __str__(self) -> str:
        return f"{self.split} row {self.row}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def infer_kind(columns: set[str]) -> str:
    """The kind whose columns a dataset has (used when it carries no `export.json`).

    >>> infer_kind({"prompt", "chosen", "rejected"}), infer_kind({"messages"}), infer_kind({"prompt"})
    ('dpo', 'sft', 'grpo')
    """
    if "messages" in columns:
        return "sft"
    return "dpo" if {"chosen", "rejected"} <= columns else "grpo"


def check(kind: str, splits: Mapping[str, Sequence[Row]]) -> list[Problem]:
    """Every problem of a dataset, split by split in the order of `SPLITS`.

    >>> rows = {"train": [{"task_id": "a", "messages": [{"role": "user", "content": "hi"}]}],
    ...         "test": [{"task_id": "a", "messages": [{"role": "user", "content": "hi"}]}]}
    >>> [p.reason.split(":")[0] for p in check("sft", rows)]
    ['leak', 'duplicate']
    """
    problems: list[Problem] = []
    for split in _ordered(splits):
        for i, row in enumerate(splits[split]):
            problems += [Problem(split, i, reason) for reason in row_problems(kind, row)]
    objects = {s: [r if isinstance(r, dict) else {} for r in rows] for s, rows in splits.items()}
    problems += leaks(objects) + duplicates(kind, objects)
    order = {name: n for n, name in enumerate(_ordered(splits))}
    return sorted(problems, key=lambda p: (order[p.split], p.row))


def row_problems(kind: str, row: Row) -> list[str]:
    """Schema and empty-content problems of one row.

    >>> row_problems("dpo", {"task_id": "a", "prompt": "q", "chosen": "", "rejected": "no"})
    ['empty: chosen is empty']
    """
    if not isinstance(row, dict):
        return [f"schema: a row must be an object, got {type(row).__name__}"]
    missing = [c for c in REQUIRED[kind] if row.get(c) is None]
    if missing:
        return [f"schema: no {', '.join(missing)} column (kind {kind})"]
    out = [] if isinstance(row.get("task_id"), str) and row["task_id"] else ["schema: no task_id"]
    conversational = [c for c in REQUIRED[kind] if not isinstance(row[c], str)]
    if conversational and len(conversational) != len(REQUIRED[kind]):
        out.append(f"schema: {', '.join(REQUIRED[kind])} mix text and conversations")
    for column in REQUIRED[kind]:
        out += _value_problems(column, row[column])
    return out


def _value_problems(column: str, value: Any) -> list[str]:
    if isinstance(value, str):
        return [] if value.strip() else [f"empty: {column} is empty"]
    if not isinstance(value, list):
        return [f"schema: {column} must be a list of messages or a string, got {type(value).__name__}"]
    if not value:
        return [f"empty: {column} has no messages"]
    out = []
    for i, message in enumerate(value):
        reason = _message_problem(message)
        if reason:
            out.append(reason.format(where=f"{column}[{i}]"))
    return out


def _message_problem(message: Any) -> str | None:
    if not isinstance(message, dict):
        return f"schema: {{where}} must be a message object, got {type(message).__name__}"
    role = message.get("role")
    if role not in ROLES:
        return f"schema: {{where}} has role {role!r} (expected one of {', '.join(sorted(ROLES))})"
    content = message.get("content")
    if isinstance(content, list):  # content parts ([{"type": "text", "text": ...}]): text of the parts
        content = "".join(str(p.get("text") or "") if isinstance(p, dict) else "" for p in content)
    elif content is not None and not isinstance(content, str):
        return f"schema: {{where}} content must be a string or a list of parts, got {type(content).__name__}"
    if role != "tool" and not (content or "").strip() and not message.get("tool_calls"):
        return f"empty: {{where}} ({role}) has no content and no tool call"
    return None


def leaks(splits: Mapping[str, Sequence[Row]]) -> list[Problem]:
    """Rows whose task already has rows in an earlier split."""
    home: dict[str, str] = {}
    out = []
    for split in _ordered(splits):
        for i, row in enumerate(splits[split]):
            task = row.get("task_id")
            if not isinstance(task, str) or not task:
                continue
            first = home.setdefault(task, split)
            if first != split:
                out.append(Problem(split, i, f"leak: task {task!r} is also in {first}"))
    return out


def duplicates(kind: str, splits: Mapping[str, Sequence[Row]]) -> list[Problem]:
    """Rows whose training content equals an earlier row's (named by split and row)."""
    seen: dict[str, tuple[str, int]] = {}
    out = []
    for split in _ordered(splits):
        for i, row in enumerate(splits[split]):
            if not row:
                continue  # not an object: already a schema problem
            digest = content_digest(kind, row)
            first = seen.setdefault(digest, (split, i))
            if first != (split, i):
                out.append(Problem(split, i, f"duplicate: same content as {first[0]} row {first[1]}"))
    return out


def content_digest(kind: str, row: Row) -> str:
    """sha256 of the row's training columns (None and absent keys inside messages count alike)."""
    body = {c: _clean(row.get(c)) for c in CONTENT[kind]}
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _clean(value: Any) -> Any:
    """Drop None-valued keys: Parquet gives every message every key seen in the column."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _ordered(splits: Mapping[str, Sequence[Row]]) -> list[str]:
    known = [s for s in SPLITS if s in splits]
    return known + sorted(s for s in splits if s not in SPLITS)

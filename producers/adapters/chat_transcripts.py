"""What the chat-transcript adapters (OpenAI and Anthropic messages) share, and differ in only by
what a message is: finding the episodes of a file (`chat_episodes`), the task id, the explicit
outcome, token sums, and one draft per record with a rejection for a record that cannot be converted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from producers.adapters.contract import EpisodeDraft, Rejection
from producers.errors import AdapterError


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

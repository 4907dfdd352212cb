"""Anthropic Messages transcripts: content blocks `text`, `thinking`, `tool_use` and `tool_result`.

Messages as the Messages API defines them: `{role: user|assistant, content: str | [blocks]}` with
blocks `{type: "text", text}`, `{type: "thinking", thinking}`, `{type: "tool_use", id, name, input}`
(assistant) and `{type: "tool_result", tool_use_id, content: str | [blocks], is_error?}` (user); the
system prompt is the top-level `system`, not a message.

Accepted containers:
- a JSON object with `messages` (a request body or saved conversation; optional `model`, `system`,
  `id`, `metadata`), JSON Lines or a JSON array of such objects (one episode each), or a bare array of
  messages (one episode);
- Claude Code session files (`~/.claude/projects/<project>/<session>.jsonl`): one entry per line,
  `{type: "user"|"assistant"|"summary"|"system"|..., message: {role, content, model, id, usage},
  uuid, parentUuid, timestamp, sessionId, isSidechain, isMeta, version}`. One API response is often
  split over several entries with the same `message.id`; they are merged back into one turn.

Mapping: task = the first user text; one step per `tool_use` (tool name normalised, params = `input`),
observation = the text of the `tool_result` with the same id, error = that text when `is_error`;
the turn's text and thinking are the first step's thought. A turn without tool_use is a `message` step
(params `{"content": text}`) whose observation is the user's next text. Timestamps are the entries'
own (Claude Code) or a message's `timestamp`/`created_at` when present. Tokens per turn:
input = input_tokens + cache_creation_input_tokens + cache_read_input_tokens, output = output_tokens.
Outcome only from explicit `success`/`score` fields on the record; Claude Code sessions state none.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from producers.adapters.chat_transcripts import (
    apply_chat_outcome,
    chat_drafts,
    chat_episodes,
    chat_task_id,
    sum_step_tokens,
)
from producers.adapters.contract import Document, EpisodeDraft, Rejection, StepDraft
from producers.adapters.fields import describe, non_negative, parse_timestamp, shape_of, text_of
from producers.adapters.tools import normalise_tool
from producers.errors import AdapterError

name = "anthropic"

_CLAUDE_CODE_TYPES = {"user", "assistant", "summary", "system", "file-history-snapshot", "queue-operation"}


@dataclass
class _Turn:
    """One message, with Claude Code entry data folded in."""

    role: str
    blocks: list[dict]
    timestamp: Any = None
    usage: dict = field(default_factory=dict)
    model: str = ""
    message_id: str = ""


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and value.get("role") in ("user", "assistant") and "content" in value


def _is_claude_code(doc: Document) -> bool:
    records = doc.records if doc.kind == "jsonl" else ()
    typed = [r for r in records if isinstance(r, dict) and r.get("type") in _CLAUDE_CODE_TYPES]
    return (
        bool(records)
        and len(typed) == len(records)
        and any(isinstance(r.get("message"), dict) for r in typed)
    )


def _blocks_signal(messages: list[dict]) -> bool:
    return any(
        isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result", "thinking")
        for m in messages
        if isinstance(m.get("content"), list)
        for b in m["content"]
    )


def detect(doc: Document) -> float:
    if _is_claude_code(doc):
        return 0.95
    episodes = _episodes(doc)
    if not episodes:
        return 0.0
    messages = [m for _, r, _ in episodes for m in r["messages"]]
    if _blocks_signal(messages) or any(isinstance(r.get("system"), str | list) for _, r, _ in episodes):
        return 0.9
    return 0.4


def _episodes(doc: Document) -> list[tuple[str, dict, str]]:
    return chat_episodes(doc, _is_message)


def parse(doc: Document) -> Iterator[EpisodeDraft | Rejection]:
    if _is_claude_code(doc):
        yield _claude_code_episode(doc)
        return
    episodes = _episodes(doc)
    if not episodes:
        raise AdapterError(
            f"{doc.path}: not an Anthropic Messages transcript: expected an object with 'messages' "
            "(role user/assistant, content string or blocks), a JSON Lines file of them, an array of "
            f"messages, or a Claude Code session; got {shape_of(doc)}"
        )
    yield from chat_drafts(doc, episodes, _record_episode)


def _record_episode(doc: Document, key: str, record: dict, multi: bool) -> EpisodeDraft:
    turns = [_turn(m, m.get("timestamp") or m.get("created_at")) for m in record["messages"]]
    walk = _Walk(turns)
    meta = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    metadata: dict[str, Any] = {}
    if record.get("system"):
        metadata["system_prompt"] = text_of(record["system"])
    if meta:
        metadata["record_metadata"] = meta
    draft = EpisodeDraft(
        key=key,
        task_id=chat_task_id(doc, key, record, meta, multi),
        task=walk.task,
        domain="generic" if any(s.tool != "message" for s in walk.steps) else "conversation",
        agent=str(record.get("agent") or meta.get("agent") or ""),
        model=str(record.get("model") or walk.model or ""),
        steps=walk.steps,
        metadata=metadata,
    )
    _apply_outcome(draft, record, meta)
    return draft


def _claude_code_episode(doc: Document) -> EpisodeDraft:
    turns: list[_Turn] = []
    skipped: dict[str, int] = {}
    session, version, first_time, last_time = "", "", None, None
    for record in doc.records:
        when = parse_timestamp(record.get("timestamp"))[0]
        first_time = first_time or when
        last_time = when or last_time
        session = session or str(record.get("sessionId") or "")
        version = version or str(record.get("version") or "")
        kind = record.get("type")
        if kind not in ("user", "assistant") or record.get("isSidechain") or record.get("isMeta"):
            label = "sidechain" if record.get("isSidechain") else "meta" if record.get("isMeta") else kind
            skipped[str(label)] = skipped.get(str(label), 0) + 1
            continue
        message = record.get("message") if isinstance(record.get("message"), dict) else {}
        _append_turn(turns, _turn(message, record.get("timestamp")))
    walk = _Walk(turns)
    metadata: dict[str, Any] = {"claude_code_version": version} if version else {}
    if skipped:
        metadata["skipped_entries"] = dict(sorted(skipped.items()))
    if walk.later_user_messages:
        metadata["later_user_messages"] = walk.later_user_messages
    draft = EpisodeDraft(
        key="0",
        task_id=session or doc.stem,
        task=walk.task,
        domain="coding",
        agent="claude-code",
        model=walk.model,
        steps=walk.steps,
        started_at=first_time,
        ended_at=last_time,
        metadata=metadata,
    )
    _apply_outcome(draft, {}, {})
    return draft


def _append_turn(turns: list[_Turn], turn: _Turn) -> None:
    """Merge the entries Claude Code writes for one API response (same message id) into one turn."""
    previous = turns[-1] if turns else None
    same_response = previous is not None and previous.role == "assistant" and turn.role == "assistant"
    if same_response and turn.message_id and previous.message_id == turn.message_id:
        previous.blocks.extend(turn.blocks)
        previous.usage = turn.usage or previous.usage
        return
    turns.append(turn)


def _turn(message: dict, timestamp: Any) -> _Turn:
    content = message.get("content")
    if isinstance(content, str):
        blocks = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        blocks = [b if isinstance(b, dict) else {"type": "text", "text": str(b)} for b in content]
    else:
        raise AdapterError(f"message.content must be a string or a list of blocks, got {describe(content)}")
    return _Turn(
        role=str(message.get("role", "")),
        blocks=blocks,
        timestamp=timestamp,
        usage=message.get("usage") if isinstance(message.get("usage"), dict) else {},
        model=str(message.get("model") or ""),
        message_id=str(message.get("id") or ""),
    )


class _Walk:
    """Steps from turns: tool_use blocks paired with tool_result blocks by id."""

    def __init__(self, turns: list[_Turn]):
        self.steps: list[StepDraft] = []
        self.task = ""
        self.model = ""
        self.later_user_messages: list[str] = []
        self._results = {
            b.get("tool_use_id"): b for t in turns for b in t.blocks if b.get("type") == "tool_result"
        }
        last_reply: StepDraft | None = None
        for turn in turns:
            if turn.role == "assistant":
                new = self._assistant(turn)
                self.steps.extend(new)
                last_reply = new[-1] if len(new) == 1 and new[0].tool == "message" else None
                continue
            text = "\n".join(
                b["text"] for b in turn.blocks if b.get("type") == "text" and isinstance(b.get("text"), str)
            )
            if not text:
                continue  # only tool results
            if not self.task:
                self.task = text
            elif last_reply is not None and not last_reply.observation:
                last_reply.observation = text
            else:
                self.later_user_messages.append(text)
            last_reply = None

    def _assistant(self, turn: _Turn) -> list[StepDraft]:
        if turn.model and turn.model != "<synthetic>" and not self.model:
            self.model = turn.model
        texts = [b.get("text", "") for b in turn.blocks if b.get("type") == "text"]
        thinking = [b.get("thinking", "") for b in turn.blocks if b.get("type") == "thinking"]
        uses = [b for b in turn.blocks if b.get("type") == "tool_use"]
        when = parse_timestamp(turn.timestamp)[0]
        usage = _usage(turn.usage)
        if not uses:
            step = StepDraft(
                tool="message", params={"content": "\n".join(texts)}, thought="\n".join(thinking)
            )
            step.timestamp, (step.input_tokens, step.output_tokens) = when, usage
            return [step]
        thought = "\n".join(t for t in [*thinking, *texts] if t)
        steps = [self._tool_step(use, thought if n == 0 else "", when) for n, use in enumerate(uses)]
        steps[0].input_tokens, steps[0].output_tokens = usage
        return steps

    def _tool_step(self, use: dict, thought: str, when) -> StepDraft:
        params = use.get("input") if isinstance(use.get("input"), dict) else {}
        result = self._results.get(use.get("id")) or {}
        observation = text_of(result.get("content"))
        return StepDraft(
            tool=normalise_tool(str(use.get("name") or ""), params),
            params=dict(params),
            thought=thought,
            observation=observation,
            error=(observation or "tool_result.is_error") if result.get("is_error") is True else None,
            timestamp=when,
        )


def _usage(usage: dict) -> tuple[int | None, int | None]:
    parts = [
        non_negative(usage.get(k))
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    ]
    known = [p for p in parts if p is not None]
    return (sum(known) if known else None), non_negative(usage.get("output_tokens"))


def _apply_outcome(draft: EpisodeDraft, record: dict, meta: dict) -> None:
    apply_chat_outcome(draft, record, meta)
    sum_step_tokens(draft)

"""OpenAI-style chat transcripts with tool calls (Chat Completions message format).

Messages as the Chat Completions API defines them: `{role: system|developer|user|assistant|tool,
content}`; an assistant message may carry `tool_calls: [{id, type: "function", function: {name,
arguments}}]` where `arguments` is a JSON *string*; each result is a `{role: "tool", tool_call_id,
content}` message. The legacy `function_call: {name, arguments}` / `{role: "function", name}` pair is
read too.

Accepted containers: a JSON object with `messages` (a request body or a saved conversation, optional
`model`, `tools`, `id`, `metadata`), JSON Lines of such objects (the fine-tuning format; one
episode per line), a JSON array of such objects, or a bare JSON array / JSON Lines of messages (one
episode).

Mapping: task = the first user message; one step per tool call (tool name normalised, params = the
decoded arguments; arguments that are not valid JSON are kept as `{"arguments": raw}` with the step's
error saying so), observation = the tool message with the same id; the assistant text that came with
the calls is the first call's thought. An assistant message without tool calls is a `message` step
(params `{"content": text}`) whose observation is the user's next message. Timestamps come from a
message's `timestamp`/`created_at`/`created` field when present. Outcome only from explicit fields
on the record (`success` bool, `score` in [0, 1], or the same under `metadata`); otherwise unknown.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from producers.adapters.chat_transcripts import (
    apply_chat_outcome,
    chat_drafts,
    chat_episodes,
    chat_task_id,
    sum_step_tokens,
)
from producers.adapters.contract import Document, EpisodeDraft, Rejection, StepDraft
from producers.adapters.fields import json_args, non_negative, parse_timestamp, shape_of, text_of
from producers.adapters.tools import normalise_tool
from producers.errors import AdapterError

name = "openai"

_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def detect(doc: Document) -> float:
    episodes = _episodes(doc)
    if not episodes:
        return 0.0
    messages = [m for _, record, _ in episodes for m in record["messages"]]
    if any(_anthropic_signal(m) for m in messages) or any("system" in r for _, r, _ in episodes):
        return 0.0
    if any(
        m.get("tool_calls") or m.get("function_call") or m.get("role") in ("tool", "function")
        for m in messages
    ):
        return 0.85
    return 0.5


def _anthropic_signal(message: dict) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result", "thinking") for b in content
    )


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and value.get("role") in _ROLES


def _episodes(doc: Document) -> list[tuple[str, dict, str]]:
    return chat_episodes(doc, _is_message)


def parse(doc: Document) -> Iterator[EpisodeDraft | Rejection]:
    episodes = _episodes(doc)
    if not episodes:
        raise AdapterError(
            f"{doc.path}: not an OpenAI chat transcript: expected an object with 'messages' (each with a "
            f"role in {sorted(_ROLES)}), a JSON Lines file of them, or an array of messages; "
            f"got {shape_of(doc)}"
        )
    yield from chat_drafts(doc, episodes, _episode)


def _episode(doc: Document, key: str, record: dict, multi: bool) -> EpisodeDraft:
    messages = record["messages"]
    steps, task, unanswered, later = _steps(messages)
    meta = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    system = next((text_of(m.get("content")) for m in messages if m["role"] in ("system", "developer")), "")
    metadata: dict[str, Any] = {"system_prompt": system} if system else {}
    if unanswered:
        metadata["unanswered_tool_calls"] = unanswered
    if later:
        metadata["later_user_messages"] = later
    if meta:
        metadata["record_metadata"] = meta
    draft = EpisodeDraft(
        key=key,
        task_id=chat_task_id(doc, key, record, meta, multi),
        task=task,
        domain="generic" if any(s.tool != "message" for s in steps) else "conversation",
        agent=str(record.get("agent") or meta.get("agent") or ""),
        model=str(record.get("model") or meta.get("model") or ""),
        steps=steps,
        metadata=metadata,
    )
    _apply_outcome(draft, record, meta)
    return draft


def _steps(messages: list[dict]) -> tuple[list[StepDraft], str, int, list[str]]:
    """Steps, the task (first user message), the number of tool calls with no result, and later
    user messages that are not a reply to a `message` step."""
    results = {m.get("tool_call_id"): m for m in messages if m["role"] == "tool" and m.get("tool_call_id")}
    steps: list[StepDraft] = []
    task, unanswered, later = "", 0, []
    last_reply: StepDraft | None = None
    for index, message in enumerate(messages):
        role = message["role"]
        if role == "user":
            text = text_of(message.get("content"))
            if not task:
                task = text
            elif last_reply is not None and not last_reply.observation:
                last_reply.observation = text
            else:
                later.append(text)
            last_reply = None
        elif role == "assistant":
            new = _assistant_steps(message, messages, index, results)
            unanswered += sum(1 for s in new if s.tool != "message" and s.observation is None)
            for step in new:
                step.observation = step.observation or ""
            steps.extend(new)
            last_reply = new[-1] if len(new) == 1 and new[0].tool == "message" else None
    return steps, task, unanswered, later


def _assistant_steps(message: dict, messages: list[dict], index: int, results: dict) -> list[StepDraft]:
    text = text_of(message.get("content"))
    when = _timestamp(message)
    usage = _usage(message)
    calls = message.get("tool_calls") if isinstance(message.get("tool_calls"), list) else []
    if not calls and isinstance(message.get("function_call"), dict):
        calls = [{"id": None, "function": message["function_call"]}]
    if not calls:
        return [StepDraft(tool="message", params={"content": text}, timestamp=when, model=_model(message))]
    steps = []
    for n, call in enumerate(calls):
        function = (
            call.get("function") if isinstance(call, dict) and isinstance(call.get("function"), dict) else {}
        )
        params, error = json_args(function.get("arguments"))
        result = results.get(call.get("id")) if call.get("id") else _function_result(messages, index)
        step = StepDraft(
            tool=normalise_tool(str(function.get("name") or ""), params),
            params=params,
            thought=text if n == 0 else "",
            observation=text_of(result.get("content")) if result else None,  # type: ignore[arg-type]
            error=error,
            timestamp=when,
            model=_model(message),
        )
        if n == 0:
            step.input_tokens, step.output_tokens = usage
        steps.append(step)
    return steps


def _function_result(messages: list[dict], index: int) -> dict | None:
    for message in messages[index + 1 :]:
        if message["role"] == "function":
            return message
        if message["role"] == "assistant":
            return None
    return None


def _timestamp(message: dict):
    for field in ("timestamp", "created_at", "created"):
        when = parse_timestamp(message.get(field))[0]
        if when is not None:
            return when
    return None


def _model(message: dict) -> str:
    return str(message.get("model") or "")


def _usage(message: dict) -> tuple[int | None, int | None]:
    usage = message.get("usage") if isinstance(message.get("usage"), dict) else {}
    return non_negative(usage.get("prompt_tokens")), non_negative(usage.get("completion_tokens"))


def _apply_outcome(draft: EpisodeDraft, record: dict, meta: dict) -> None:
    apply_chat_outcome(draft, record, meta)
    usage = record.get("usage") if isinstance(record.get("usage"), dict) else {}
    draft.input_tokens = non_negative(usage.get("prompt_tokens"))
    draft.output_tokens = non_negative(usage.get("completion_tokens"))
    if draft.input_tokens is None:
        sum_step_tokens(draft)

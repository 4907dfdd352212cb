"""The two span conventions the gateway reads: OpenTelemetry GenAI (`gen_ai.*`) and OpenInference
(`openinference.span.kind`, `llm.*`, `input.value` / `output.value`).

Owns what a span's attributes mean: which kind of span it is (the tables), and the fields of a
tool step, an LLM step and an episode's task as each convention writes them (docs/otlp.md has the
table). Pure functions over an attribute dict; building the events is `events`.
"""

from __future__ import annotations

from typing import Any

import orjson

OPENINFERENCE_KINDS = {"LLM": "llm", "TOOL": "tool", "AGENT": "agent", "CHAIN": "chain"}
GENAI_OPERATIONS = {
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
    "execute_tool": "tool",
    "invoke_agent": "agent",
    "create_agent": "agent",
    "invoke_workflow": "chain",
}


def span_kind(a: dict[str, Any]) -> str | None:
    """llm | tool | agent | chain, or None when neither convention names it."""
    oi = a.get("openinference.span.kind")
    if isinstance(oi, str):
        return OPENINFERENCE_KINDS.get(oi.upper())
    op = a.get("gen_ai.operation.name")
    if isinstance(op, str):
        return GENAI_OPERATIONS.get(op)
    if "gen_ai.request.model" in a or "gen_ai.system" in a:
        return "llm"
    return None


def unmapped_kind(a: dict[str, Any]) -> str:
    """Why a non-root span whose kind is None is not mapped."""
    oi = a.get("openinference.span.kind")
    op = a.get("gen_ai.operation.name")
    if oi is not None or op is not None:
        return f"span kind {oi or op!r} is not mapped (LLM/chat, TOOL/execute_tool, AGENT, CHAIN are)"
    return "neither gen_ai.operation.name nor openinference.span.kind: not a GenAI span"


def tool_fields(a: dict[str, Any], span_name: str) -> dict[str, Any]:
    """A tool step's `tool`, `params` and `observation`."""
    name = a.get("gen_ai.tool.name") or a.get("tool.name") or span_name.removeprefix("execute_tool ")
    args = first(a, "gen_ai.tool.call.arguments", "input.value")
    result = first(a, "gen_ai.tool.call.result", "output.value")
    return {"tool": str(name), "params": tool_params(args), "observation": text(result)}


def llm_fields(a: dict[str, Any]) -> dict[str, Any]:
    """An LLM step's thought, tool calls, model, token counts and finish reason."""
    thought, calls, finish = _output(a)
    reasons = a.get("gen_ai.response.finish_reasons")
    if finish is None and isinstance(reasons, list) and reasons:
        finish = str(reasons[0])
    return {
        "thought": thought,
        "params": {"tool_calls": calls} if calls else {},
        "model": str(first(a, "gen_ai.response.model", "gen_ai.request.model", "llm.model_name") or ""),
        "input_tokens": first(
            a, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt"
        ),
        "output_tokens": first(
            a, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion"
        ),
        "finish_reason": finish,
    }


def _output(a: dict[str, Any]) -> tuple[str, list[dict], str | None]:
    """The model's text, its tool calls and finish reason: gen_ai.output.messages, else OpenInference
    llm.output_messages.*, else output.value."""
    messages = json_value(a.get("gen_ai.output.messages"))
    if isinstance(messages, list):
        texts, calls, finish = [], [], None
        for message in (m for m in messages if isinstance(m, dict)):
            finish = finish or message.get("finish_reason")
            for part in (p for p in message.get("parts") or [] if isinstance(p, dict)):
                if part.get("type") == "text":
                    texts.append(text(part.get("content")))
                elif part.get("type") == "tool_call":
                    calls.append({"name": part.get("name"), "arguments": tool_params(part.get("arguments"))})
        return "\n".join(texts), calls, finish
    texts, calls = [], []
    for i in range(64):
        prefix = f"llm.output_messages.{i}.message."
        if not any(k.startswith(prefix) for k in a):
            break
        texts += [text(a[prefix + "content"])] if prefix + "content" in a else []
        for j in range(64):
            name = a.get(f"{prefix}tool_calls.{j}.tool_call.function.name")
            if name is None:
                break
            calls.append(
                {
                    "name": name,
                    "arguments": tool_params(a.get(f"{prefix}tool_calls.{j}.tool_call.function.arguments")),
                }
            )
    if not texts and not calls:
        texts = [text(a.get("output.value"))] if a.get("output.value") is not None else []
    return "\n".join(texts), calls, None


def task(a: dict[str, Any]) -> str:
    """The episode's task: the last user message's text, else `agentstream.task` / `input.value`."""
    messages = json_value(a.get("gen_ai.input.messages"))
    if isinstance(messages, list):
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        parts = [p for m in users[-1:] for p in m.get("parts") or [] if isinstance(p, dict)]
        return "\n".join(text(p.get("content")) for p in parts if p.get("type") == "text")
    return text(first(a, "agentstream.task", "input.value"))


# --- attribute values ------------------------------------------------------------------------------


def first(a: dict[str, Any], *keys: str) -> Any:
    """The value of the first of `keys` that is set (conventions name one field several ways)."""
    return next((a[k] for k in keys if a.get(k) is not None), None)


def text(value: Any) -> str:
    """An attribute as text: a string as is, anything else as JSON, None as ""."""
    if value is None:
        return ""
    return value if isinstance(value, str) else orjson.dumps(value, default=str).decode()


def json_value(value: Any) -> Any:
    """A JSON-encoded attribute decoded (None when it is not JSON); other values as they are."""
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    return value


def tool_params(value: Any) -> dict[str, Any]:
    """Tool arguments as a dict: a JSON object (or its text); anything else as {"input": value}."""
    parsed = json_value(value) if isinstance(value, str) else value
    if isinstance(parsed, dict):
        return parsed
    return {} if value is None or value == "" else {"input": parsed if parsed is not None else value}

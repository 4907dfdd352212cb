"""Tool calls in a completion's text: parsed as the chat template writes them, never guessed.

The tiny model's template (and Qwen2.5 / Hermes-style templates) write a call as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. A completion is split into its text and
its calls; a call that is not valid JSON with a string `name` and object `arguments` is not
returned as a call: the whole completion is then returned as text, with `malformed=True`.

>>> parse('ok <tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>').calls[0].name
'bash'
>>> parse('<tool_call>{"name": "bash", "arguments": </tool_call>').malformed
True
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
OPEN = "<tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict

    def openai(self, call_id: str) -> dict:
        """The OpenAI `tool_calls` entry (arguments as a JSON string, as the API has them)."""
        arguments = json.dumps(self.arguments, ensure_ascii=False)
        return {"id": call_id, "type": "function", "function": {"name": self.name, "arguments": arguments}}


@dataclass(frozen=True)
class ParsedCompletion:
    text: str
    calls: list[ToolCall] = field(default_factory=list)
    malformed: bool = False


def parse(completion: str) -> ParsedCompletion:
    """Split `completion` into text and tool calls (see the module docstring)."""
    if OPEN not in completion:
        return ParsedCompletion(completion)
    calls = []
    for body in CALL.findall(completion):
        call = _call(body)
        if call is None:
            return ParsedCompletion(completion, malformed=True)
        calls.append(call)
    rest = CALL.sub("", completion)
    if OPEN in rest:  # an opened call that never closed (cut by max_tokens, or garbled)
        return ParsedCompletion(completion, malformed=True)
    return ParsedCompletion(rest.strip(), calls)


def _call(body: str) -> ToolCall | None:
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], arguments)

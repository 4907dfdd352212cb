"""Tool calls in a completion's text: parsed as the chat template writes them, never guessed.

The tiny model's template (and Qwen2.5 / Hermes-style templates) write a call as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. A completion is split into its text and
its calls; a call that is not valid JSON with a string `name` and object `arguments` is not
returned as a call: the whole completion is then returned as text, with `malformed=True`. The text
of a completion with calls is the rest without them and without trailing whitespace.

`call_opening` derives, from the chat template itself, the text that opens a call (all of it up
to the function's name, or up to its arguments for a named function): what the server appends to
the prompt to force a call (`tool_choice` required or a named function).

>>> parse('ok <tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>').calls[0].name
'bash'
>>> parse('<tool_call>{"name": "bash", "arguments": </tool_call>').malformed
True
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from producers.policy.openai_fields import FUNCTION_NAME, json_problem

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
    # only trailing whitespace goes: what a stream sent before the first call stays a prefix
    return ParsedCompletion(rest.rstrip(), calls)


def _call(body: str) -> ToolCall | None:
    """The call `body` writes, or None: not JSON, a name outside OpenAI's pattern, arguments not an
    object, or arguments a client could not send back (too deep, a lone surrogate: `json_problem`)."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    if not FUNCTION_NAME.fullmatch(value["name"]):
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict) or json_problem(arguments) is not None:
        return None
    return ToolCall(value["name"], arguments)


PROBE_NAME = "agentstream_probe_function"
PROBE_KEY = "agentstream_probe_argument"


def call_opening(render: Callable[[list[dict], bool], str], name: str | None) -> str | None:
    """The text the chat template writes at the start of an assistant turn that calls a function,
    up to the function's name (`name` None: any function) or up to its arguments (`name` given), as
    the template renders it: so the model continues a call exactly as it was trained to write one.
    `render(messages, add_generation_prompt)` is the template rendered to text. None when the
    template does not write a call as its name then its arguments object after the generation prompt.

    >>> def render(messages, generation):  # the tiny model's way of writing a call
    ...     text = "<user>" + ("<assistant>" if generation or len(messages) > 1 else "")
    ...     for call in messages[1]["tool_calls"] if len(messages) > 1 else []:
    ...         function = call["function"]
    ...         arguments = json.dumps(function["arguments"])
    ...         text += '\\n<tool_call>{"name": "' + function["name"] + '", "arguments": ' + arguments + "}"
    ...     return text
    >>> call_opening(render, None)
    '\\n<tool_call>{"name": "'
    >>> call_opening(render, "a")
    '\\n<tool_call>{"name": "a", "arguments": '
    """
    probe = _assistant_text(render, PROBE_NAME)
    at_name = probe.find(PROBE_NAME) if probe is not None else -1
    if at_name < 0 or probe.find(PROBE_KEY) < at_name:
        return None
    if name is None:
        return probe[:at_name]
    named = _assistant_text(render, name)
    if named is None or not named.startswith(probe[:at_name]):
        return None
    opening = named.rfind("{", at_name, named.find(PROBE_KEY))  # the arguments object opens here
    return named[:opening] if opening > at_name else None


def _assistant_text(render: Callable[[list[dict], bool], str], name: str) -> str | None:
    """What the template writes after the generation prompt for a turn calling `name` (arguments
    as an object, as chat templates take them), or None when the turn does not extend the prompt."""
    call = {"id": "call_probe", "type": "function", "function": {"name": name, "arguments": {PROBE_KEY: 0}}}
    user = {"role": "user", "content": "probe"}
    prompt = render([user], True)
    turn = render([user, {"role": "assistant", "content": "", "tool_calls": [call]}], False)
    return turn[len(prompt) :] if turn.startswith(prompt) else None

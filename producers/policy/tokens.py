"""Token continuity between the turns of one episode: pure, no model, no I/O.

The policy server never re-tokenises history silently. For each turn it knows the previous turn's
context (prompt + completion token ids, exactly as the model saw and produced them). The new prompt
either extends that context token for token (`ok`: only the new tokens are stored, as a delta), or
it does not (`broken`: the history the client sent says something else than what the model saw;
the delta then starts at the first differing position and the step is marked ineligible for
token-level RL). Either way the prompt the model saw is `context[:start] + delta`, so the stored
tokens always reproduce it exactly.

>>> prompt_delta([1, 2, 3], [1, 2, 3, 4, 5])
PromptDelta(start=3, token_ids=[4, 5], continuity='ok', break_at=None)
>>> prompt_delta([1, 2, 3], [1, 9, 3, 4])
PromptDelta(start=1, token_ids=[9, 3, 4], continuity='broken', break_at=1)
>>> prompt_delta(None, [7, 8])
PromptDelta(start=0, token_ids=[7, 8], continuity='first', break_at=None)

Whether the client sent back what the model wrote is decided by meaning, not by text: a message's
meaning is its role, its text, its `tool_call_id` and its tool calls by name and parsed arguments
(JSON-equal: spacing and key order do not count, `1` and `true` differ). A chat template that
re-renders a tool call from the parsed message, or a client that re-serialises the arguments, says
the same thing as the sample (see producers/policy/turns.py for how the sampled tokens are reused).

>>> call = {"function": {"name": "read", "arguments": '{"path": "a.py", "n": 2}'}}
>>> same = {"function": {"name": "read", "arguments": '{"n":2,"path":"a.py"}'}}
>>> meaning({"role": "assistant", "content": None, "tool_calls": [call]}) == meaning(
...     {"role": "assistant", "content": "", "tool_calls": [same]})
True
>>> matched([b"a", b"b", b"c"], [b"a", b"x"])
1
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PromptDelta:
    start: int
    token_ids: list[int]
    continuity: str  # first | ok | broken
    break_at: int | None

    @property
    def rl_eligible(self) -> bool:
        return self.continuity != "broken"


def prompt_delta(context: Sequence[int] | None, prompt: Sequence[int]) -> PromptDelta:
    """The delta of `prompt` on the previous turn's `context` (None: no previous turn known)."""
    prompt = list(prompt)
    if context is None:
        return PromptDelta(0, prompt, "first", None)
    at = first_difference(context, prompt)
    if at is None:
        return PromptDelta(len(context), prompt[len(context) :], "ok", None)
    return PromptDelta(at, prompt[at:], "broken", at)


def first_difference(context: Sequence[int], prompt: Sequence[int]) -> int | None:
    """The first position where `prompt` does not extend `context`; None when it does."""
    for index, token in enumerate(context):
        if index >= len(prompt) or prompt[index] != token:
            return index
    return None


def reconstruct(turns: Sequence[tuple[int, Sequence[int], Sequence[int]]]) -> list[list[int]]:
    """The full token sequence (prompt + completion) of every turn, from the stored
    (prompt_delta_start, prompt_token_ids, completion token_ids) of each turn in order.

    >>> reconstruct([(0, [1, 2], [3]), (3, [4], [5, 6]), (1, [9], [7])])
    [[1, 2, 3], [1, 2, 3, 4, 5, 6], [1, 9, 7]]
    """
    sequences: list[list[int]] = []
    context: list[int] = []
    for start, delta, completion in turns:
        context = [*context[:start], *delta, *completion]
        sequences.append(context)
    return sequences


def meaning(message: dict) -> bytes:
    """A digest (16 bytes) of what `message` says (see the module docstring): equal for a reply as
    the server returned it and the same message as a client sends it back, whatever the JSON spacing
    and key order of its tool-call arguments; `content` None and "" are the same (no text)."""
    calls = [_call_meaning(call) for call in message.get("tool_calls") or ()]
    said = [message.get("role"), message.get("content") or "", message.get("tool_call_id") or "", calls]
    return _digest(said)


def tools_meaning(tools: list[dict] | None) -> bytes:
    """A digest of the tools offered (None and [] the same: no tools), key order not counted."""
    return _digest(tools or [])


def matched(meanings: Sequence[bytes], stored: Sequence[bytes]) -> int:
    """How many leading messages of a request (`meanings`) say what `stored` says."""
    count = 0
    for new, old in zip(meanings, stored, strict=False):
        if new != old:
            break
        count += 1
    return count


def _call_meaning(call: Any) -> list:
    function = call.get("function", call) if isinstance(call, dict) else {}
    if not isinstance(function, dict):
        return ["?", repr(function)]
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):  # not JSON (or nested past parsing): only itself
            return [function.get("name"), "raw", arguments]
    return [function.get("name"), "json", arguments]


def _digest(value: Any) -> bytes:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)
    return hashlib.blake2b(canonical.encode(), digest_size=16).digest()

"""Token continuity between the turns of one episode: pure, no model, no I/O.

The policy server never re-tokenises history silently. For each turn it knows the previous turn's
context (prompt + completion token ids, exactly as the model saw and produced them). The new prompt
either extends that context token for token (`ok`: only the new tokens are stored, as a delta), or
it does not (`broken`: a framework re-rendered the history; the delta then starts at the first
differing position and the step is marked ineligible for token-level RL). Either way the prompt the
model saw is `context[:start] + delta`, so the stored tokens always reproduce it exactly.

>>> prompt_delta([1, 2, 3], [1, 2, 3, 4, 5])
PromptDelta(start=3, token_ids=[4, 5], continuity='ok', break_at=None)
>>> prompt_delta([1, 2, 3], [1, 9, 3, 4])
PromptDelta(start=1, token_ids=[9, 3, 4], continuity='broken', break_at=1)
>>> prompt_delta(None, [7, 8])
PromptDelta(start=0, token_ids=[7, 8], continuity='first', break_at=None)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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

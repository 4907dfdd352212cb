"""Token sequences of a trajectory rebuilt from the token ids the policy server recorded (pure).

Each step carries its prompt as a delta over the previous turn's context (prompt + completion):
the prompt the model saw is `context[:prompt_delta_start] + prompt_token_ids`, and the next context
is that prompt + the step's `token_ids`. Replaying the deltas gives the final full context without
re-tokenising anything, with per-token masks:

- `labels`: the token id at completion tokens of steps whose `token_continuity` is not "broken",
  -100 at prompt / observation tokens and at broken steps' completions;
- `step_ids`: the step position a token belongs to (a prompt delta belongs to the turn it precedes;
  -1 for the first turn's prompt);
- `behaviour_logprobs`: the recorded logprob at trainable positions, None elsewhere.

A broken step's prompt was re-rendered, so the sequence from its break on is replaced: completions
before it that fall after the break are no longer in the final context (not trained in this row).
This module must not import producers (consumers sit beside them); the replay is the same as the
policy server's, written again in a few lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

IGNORE = -100


@dataclass
class TokenSequence:
    """Parallel per-token lists of one trajectory's final context."""

    input_ids: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    step_ids: list[int] = field(default_factory=list)
    behaviour_logprobs: list[float | None] = field(default_factory=list)

    def cut(self, length: int) -> None:
        """Keep the first `length` tokens (a step's prompt starts from `context[:start]`)."""
        for name in ("input_ids", "labels", "step_ids", "behaviour_logprobs"):
            del getattr(self, name)[length:]

    def extend(self, ids: list[int], step: int, logprobs: list[float] | None) -> None:
        """Append `ids` of step position `step`; trainable when `logprobs` is given."""
        self.input_ids += ids
        self.step_ids += [step] * len(ids)
        self.labels += list(ids) if logprobs is not None else [IGNORE] * len(ids)
        self.behaviour_logprobs += list(logprobs) if logprobs is not None else [None] * len(ids)

    def trainable(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE)

    def as_dict(self) -> dict[str, Any]:
        return {
            "input_ids": self.input_ids,
            "labels": self.labels,
            "step_ids": self.step_ids,
            "behaviour_logprobs": self.behaviour_logprobs,
        }


def has_tokens(steps: list) -> bool:
    """Every step carries what the replay needs: completion ids and logprobs of the same length,
    the prompt delta, and (after the first) where it starts.

    >>> from types import SimpleNamespace as S
    >>> has_tokens([S(token_ids=[1], logprobs=[-0.1], prompt_token_ids=[5], prompt_delta_start=None)])
    True
    >>> has_tokens([S(token_ids=[1], logprobs=None, prompt_token_ids=[5], prompt_delta_start=0)])
    False
    """
    if not steps:
        return False
    for position, s in enumerate(steps):
        if s.token_ids is None or s.logprobs is None or s.prompt_token_ids is None:
            return False
        if len(s.token_ids) != len(s.logprobs):
            return False
        if position > 0 and s.prompt_delta_start is None:
            return False
    return True


def replay(steps: list) -> TokenSequence | None:
    """The final context of `steps` (in order; see the module docstring), None when a delta starts
    past the end of the context it extends (the record is inconsistent).

    >>> from types import SimpleNamespace as S
    >>> first = S(prompt_token_ids=[1, 2], prompt_delta_start=0, token_ids=[3], logprobs=[-0.5],
    ...     token_continuity="first")
    >>> second = S(prompt_token_ids=[4], prompt_delta_start=3, token_ids=[5, 6], logprobs=[-1.0, -2.0],
    ...     token_continuity="ok")
    >>> seq = replay([first, second])
    >>> seq.input_ids, seq.labels, seq.step_ids
    ([1, 2, 3, 4, 5, 6], [-100, -100, 3, -100, 5, 6], [-1, -1, 0, 1, 1, 1])
    >>> seq.behaviour_logprobs
    [None, None, -0.5, None, -1.0, -2.0]
    """
    seq = TokenSequence()
    for position, s in enumerate(steps):
        start = s.prompt_delta_start or 0
        if start > len(seq.input_ids):
            return None
        seq.cut(start)
        seq.extend(list(s.prompt_token_ids), position if position > 0 else -1, None)
        trainable = s.token_continuity != "broken"
        seq.extend(list(s.token_ids), position, list(s.logprobs) if trainable else None)
    return seq

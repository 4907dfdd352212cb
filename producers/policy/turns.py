"""One turn of an episode: the prompt the model sees, without re-tokenising history, and the
`step.recorded` event that records it.

Per episode the server keeps the token context of the last turn (prompt + completion, per sample).
A new turn's prompt is built token-in: when the request's rendered text starts with the decoded
context (the client sent the history back as the model wrote it), the prompt is the context's own
token ids plus the new text's tokens, so nothing the model produced is re-tokenised. Otherwise the
history was re-rendered: the whole conversation is tokenised, and the step records where it first
differs from the context (`token_continuity: broken`, not eligible for token-level RL).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from producers.policy.tokens import PromptDelta, prompt_delta


@dataclass
class EpisodeState:
    """What the server remembers of one episode between its turns."""

    contexts: list[list[int]] = field(default_factory=list)  # prompt + completion, per sample
    next_step: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class Episodes:
    """Episode states by trajectory id, the least recently used dropped beyond `limit`."""

    def __init__(self, limit: int = 10_000):
        self.limit = limit
        self._states: dict[str, EpisodeState] = {}
        self._lock = threading.Lock()

    def get(self, trajectory_id: str) -> EpisodeState:
        with self._lock:
            state = self._states.pop(trajectory_id, None) or EpisodeState()
            self._states[trajectory_id] = state
            while len(self._states) > self.limit:
                del self._states[next(iter(self._states))]
            return state


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    delta: PromptDelta


def build_prompt(engine, messages: list[dict], tools: list[dict] | None, contexts: list[list[int]]) -> Prompt:
    """The prompt for this turn (see the module docstring); `contexts` empty on a first turn."""
    with engine.tokenizer_lock:
        prompt = _token_in(engine.tokenizer, messages, tools, contexts)
    if prompt is not None:
        return prompt
    prompt_ids = engine.render(messages, tools)
    return Prompt(prompt_ids, prompt_delta(contexts[0] if contexts else None, prompt_ids))


def _token_in(
    tokenizer, messages: list[dict], tools: list[dict] | None, contexts: list[list[int]]
) -> Prompt | None:
    """The prompt reusing a context's own token ids, when the rendered text extends it; else None."""
    if not contexts:
        return None
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    for context in contexts:
        context_text = tokenizer.decode(
            context, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        if text.startswith(context_text):
            suffix = tokenizer.encode(text[len(context_text) :], add_special_tokens=False)
            prompt = [*context, *suffix]
            return Prompt(prompt, prompt_delta(context, prompt))
    return None

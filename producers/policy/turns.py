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
from array import array
from dataclasses import dataclass, field

from producers.policy.tokens import PromptDelta, prompt_delta


@dataclass
class EpisodeState:
    """What the server remembers of one episode between its turns."""

    contexts: list[array] = field(default_factory=list)  # prompt + completion, per sample
    next_step: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def tokens(self) -> int:
        return sum(len(context) for context in self.contexts)


class Episodes:
    """Episode states by trajectory id, bounded twice (why: the contexts are what grows with use):

    - `token_budget`: the token ids kept in all contexts together (4 bytes each, `array('i')`);
      beyond it the least recently used episodes' contexts are dropped (their next turn is
      tokenised anew: `token_continuity` "first", a full prompt as its delta), their step count kept;
    - `limit`: episodes remembered at all (a step count and a lock each); the least recently used
      is forgotten beyond it (its next turn counts steps from 0 again unless the client sends
      `X-Agentstream-Step-Index`).

    >>> episodes = Episodes(limit=10, token_budget=5)
    >>> episodes.store("a", episodes.get("a"), [[1, 2, 3]])
    >>> episodes.store("b", episodes.get("b"), [[4, 5, 6]])
    >>> episodes.get("a").contexts, episodes.tokens
    ([], 3)
    """

    def __init__(self, limit: int = 10_000, token_budget: int = 8 * 1024 * 1024):
        self.limit = limit
        self.token_budget = token_budget
        self.tokens = 0  # in all contexts, now
        self.dropped_contexts = 0  # contexts dropped for the budget, since start
        self._states: dict[str, EpisodeState] = {}
        self._lock = threading.Lock()

    def get(self, trajectory_id: str) -> EpisodeState:
        with self._lock:
            state = self._states.pop(trajectory_id, None) or EpisodeState()
            self._states[trajectory_id] = state
            while len(self._states) > self.limit:
                self.tokens -= self._states.pop(next(iter(self._states))).tokens
            return state

    def store(self, trajectory_id: str, state: EpisodeState, contexts: list[list[int]]) -> None:
        """Keep `contexts` as the episode's (the caller holds `state.lock`), dropping the least
        recently used other contexts while over the budget, then this one's if still over."""
        packed = [array("i", context) for context in contexts]
        size = sum(len(context) for context in packed)
        with self._lock:
            current = self._states.get(trajectory_id)
            if current is not state:  # forgotten meanwhile (over `limit`): remembered again
                self._states[trajectory_id] = state
            if current is not None:
                self.tokens -= current.tokens
            state.contexts = packed
            self.tokens += size
            for other in list(self._states.values()):
                if self.tokens <= self.token_budget:
                    break
                if other is not state and other.contexts:
                    self._drop(other)
            if self.tokens > self.token_budget:
                self._drop(state)

    def _drop(self, state: EpisodeState) -> None:
        self.tokens -= state.tokens
        state.contexts = []
        self.dropped_contexts += 1


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    delta: PromptDelta


def build_prompt(engine, messages: list[dict], tools: list[dict] | None, contexts: list) -> Prompt:
    """The prompt for this turn (see the module docstring); `contexts` empty on a first turn."""
    with engine.tokenizer_lock:
        prompt = _token_in(engine.tokenizer, messages, tools, contexts)
    if prompt is not None:
        return prompt
    prompt_ids = engine.render(messages, tools)
    return Prompt(prompt_ids, prompt_delta(contexts[0] if contexts else None, prompt_ids))


def _token_in(tokenizer, messages: list[dict], tools: list[dict] | None, contexts: list) -> Prompt | None:
    """The prompt reusing a context's own token ids, when the rendered text extends it; else None."""
    if not contexts:
        return None
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    for context in contexts:
        context_text = tokenizer.decode(
            list(context), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        if text.startswith(context_text):
            suffix = tokenizer.encode(text[len(context_text) :], add_special_tokens=False)
            prompt = [*context, *suffix]
            return Prompt(prompt, prompt_delta(context, prompt))
    return None

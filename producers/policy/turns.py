"""One turn of an episode: the prompt the model sees, without re-tokenising history, and the
`step.recorded` event that records it.

Per episode the server keeps, per sample of the last turn, its token context (prompt + completion,
exactly as the model saw and wrote them) and its `History`: the meanings of the messages that
produced it (the request's messages and the assistant reply as returned to the client; see
producers/policy/tokens.py) and anchors, the token positions where its messages end.

A new turn's prompt is built token-in, by meaning: when the request's first messages say what the
stored messages say (text, and tool calls by name and parsed arguments: a chat template that
re-renders a tool call from the parsed message, or a client that re-serialises its arguments, says
the same), the prompt is the context's own token ids (the sampled completion included, its stop
token too) followed by the tokens of the text the chat template puts after that assistant turn:
the template renders the request's messages up to the reply without the generation prompt and the
whole request with it; what follows is tokenised, after the rest of the template's end of turn (the
`\n` after `<|im_end|>`; for a completion cut by `max_tokens` or a stop string, which has no stop
token, the whole end of turn `<|im_end|>\n`). So nothing the model wrote is re-tokenised or
re-rendered, and the step is `ok`.

When the request says something else (an edited user message, an edited tool-call argument, a
dropped turn), the context is reused up to the last anchor the request still agrees with (the end
of an earlier reply, or the generation prompt of the diverging reply) and the rest is rendered by
the template; the step is `broken` at the first token that differs from the context, which lies in
the first message that says something else, not in an earlier re-serialised one. Within an edited
reply it is the first token where the template's rendering of the reply as sent (its arguments in
the client's key order) differs from what the model wrote: the edited value when the two agree up to
it, else an earlier token of that reply (e.g. a key the client moved). With a template that
renders earlier turns differently once more follow (its rendering of the first messages is not a
prefix of the whole), an earlier anchor where it is a prefix is used, else the whole conversation
is rendered and tokenised anew. Tokens forced after the generation prompt (`tool_choice`) are part
of the context like the sampled ones; the reply they start is matched as returned. A turn with no context
known (the first, after a restart, or dropped for the budget) is rendered whole: `first`. Either way
the prompt the model saw is `context[:start] + delta` (producers/policy/tokens.py).

Before rendering, tool-call arguments sent as a JSON string are parsed into an object, as vLLM
does: templates render them with `tojson`.
"""

from __future__ import annotations

import json
import threading
from array import array
from dataclasses import dataclass, field

from producers.policy.tokens import PromptDelta, matched, meaning, prompt_delta, tools_meaning

START, GENERATION, END = 0, 1, 2
"""Anchor kinds. An anchor (messages, position, kind) says `context[:position]` holds the first
`messages` messages: START with none; GENERATION with the template's generation prompt after them;
END up to the last token sampled for the last of them (an assistant reply), before the rest of its
end of turn."""


@dataclass(frozen=True)
class History:
    """What produced one context, by meaning, and where in it its messages end."""

    request: tuple[bytes, ...]  # the meanings of the request's messages
    reply: bytes  # the meaning of the assistant reply as returned to the client
    tools: bytes
    anchors: tuple[tuple[int, int, int], ...]  # (messages, position, kind), by position

    @property
    def meanings(self) -> tuple[bytes, ...]:
        return (*self.request, self.reply)


@dataclass
class EpisodeState:
    """What the server remembers of one episode between its turns."""

    contexts: list[array] = field(default_factory=list)  # prompt + completion, per sample
    histories: list[History | None] = field(default_factory=list)  # per context (None: not known)
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

    def store(
        self,
        trajectory_id: str,
        state: EpisodeState,
        contexts: list[list[int]],
        replies: list[dict] | None = None,
        prompt: Prompt | None = None,
    ) -> None:
        """Keep `contexts` as the episode's (the caller holds `state.lock`), dropping the least
        recently used other contexts while over the budget, then this one's if still over.
        `replies`: the assistant message of each context as returned to the client, and `prompt`
        the turn's `Prompt` (both or neither): without them the next turn cannot match by meaning.
        The budget counts token ids; a history adds 16 bytes per message and 3 ints per turn."""
        packed = [array("i", context) for context in contexts]
        histories = prompt.histories(contexts, replies) if prompt and replies else [None] * len(packed)
        size = sum(len(context) for context in packed)
        with self._lock:
            current = self._states.get(trajectory_id)
            if current is not state:  # forgotten meanwhile (over `limit`): remembered again
                self._states[trajectory_id] = state
            if current is not None:
                self.tokens -= current.tokens
            state.contexts, state.histories = packed, histories
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
        state.contexts, state.histories = [], []
        self.dropped_contexts += 1


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    delta: PromptDelta
    meanings: tuple[bytes, ...] = ()  # of the request's messages
    tools: bytes = b""
    anchors: tuple[tuple[int, int, int], ...] = ()  # ends with the generation prompt's

    def histories(self, contexts: list, replies: list[dict]) -> list[History]:
        """The history of each context (this prompt + one sample), with `replies` as returned."""
        if len(replies) != len(contexts):
            raise ValueError(f"replies: expected one per context ({len(contexts)}), got {len(replies)}")
        end = len(self.meanings) + 1
        return [
            History(self.meanings, meaning(reply), self.tools, (*self.anchors, (end, len(context), END)))
            for context, reply in zip(contexts, replies, strict=True)
        ]


def build_prompt(
    engine, messages: list[dict], tools: list[dict] | None, contexts: list, histories: list | None = None
) -> Prompt:
    """The prompt for this turn (see the module docstring); `contexts` empty on a first turn,
    `histories` the stored one of each context (None or missing: that context matches by tokens only)."""
    messages = template_messages(messages)
    meanings, tools_key = tuple(meaning(m) for m in messages), tools_meaning(tools)
    histories = [*(histories or ()), *[None] * len(contexts)][: len(contexts)]
    agreed = [
        matched(meanings, h.meanings) if h is not None and h.tools == tools_key else -1 for h in histories
    ]
    best = max(range(len(contexts)), key=lambda i: (agreed[i], -i), default=None)
    if best is not None and agreed[best] >= 0:
        with engine.tokenizer_lock:
            reused = _reuse(engine, messages, tools, contexts[best], histories[best], agreed[best])
        if reused is not None:
            prompt_ids, anchors = reused
            return _prompt(prompt_ids, contexts[best], meanings, tools_key, anchors, len(messages))
    prompt_ids = engine.render(messages, tools)
    context = contexts[best] if best is not None else None
    return _prompt(prompt_ids, context, meanings, tools_key, ((0, 0, START),), len(messages))


def _prompt(prompt_ids, context, meanings, tools_key, anchors, count: int) -> Prompt:
    anchors = (*anchors, (count, len(prompt_ids), GENERATION))
    return Prompt(prompt_ids, prompt_delta(context, prompt_ids), meanings, tools_key, anchors)


def _reuse(engine, messages: list[dict], tools, context, history: History, agreed: int):
    """(prompt ids, anchors kept) reusing `context` up to the last anchor that the request still
    agrees with (`agreed` leading messages) and that the template renders as a prefix; None when
    only the start is left."""
    tokenizer = engine.tokenizer
    whole = _render(tokenizer, messages, tools, generation=True)
    for index in range(len(history.anchors) - 1, -1, -1):
        count, position, kind = history.anchors[index]
        if kind == START or count > agreed:
            continue
        if kind == GENERATION and (count >= len(messages) or messages[count]["role"] != "assistant"):
            continue  # the context's generation prompt opens a reply the request does not have
        head = _render(tokenizer, messages[:count], tools, generation=kind == GENERATION)
        if not whole.startswith(head):
            continue
        rest = "" if kind == GENERATION else _end_of_turn(engine, head, context[position - 1])
        if rest is None:
            continue
        suffix = tokenizer.encode(rest + whole[len(head) :], add_special_tokens=False)
        return [*context[:position], *suffix], history.anchors[: index + 1]
    return None


def _end_of_turn(engine, head: str, last_token: int) -> str | None:
    """The text of the template's end of the last turn of `head` that the context lacks: what
    follows the sampled stop token (e.g. `\n` after `<|im_end|>`), or, for a completion with no
    stop token (cut by length or a stop string), the end of turn from its stop token on (e.g.
    `<|im_end|>\n`); None when the stop token the model wrote is not where the template ends a turn."""
    tokenizer = engine.tokenizer
    ends = {i: tokenizer.decode([i], skip_special_tokens=False) for i in _stop_ids(engine)}
    if last_token in ends:
        end = ends[last_token]
        at = head.rfind(end) if end else -1
        return head[at + len(end) :] if at >= 0 else None
    at = max((head.rfind(end) for end in ends.values() if end), default=-1)
    return head[at:] if at >= 0 else ""


def _stop_ids(engine) -> list[int]:
    stop_ids = getattr(engine, "stop_ids", None)
    if stop_ids:
        return list(stop_ids)
    tokenizer = engine.tokenizer  # an engine that does not say (the proxy): eos and <|im_end|>
    found = [getattr(tokenizer, "eos_token_id", None)]
    if hasattr(tokenizer, "convert_tokens_to_ids"):
        found.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    unknown = getattr(tokenizer, "unk_token_id", None)
    return [i for i in found if isinstance(i, int) and i >= 0 and i != unknown]


def _render(tokenizer, messages: list[dict], tools, generation: bool) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=generation, tokenize=False
    )


def template_messages(messages: list[dict]) -> list[dict]:
    """`messages` with tool-call arguments sent as a JSON object string parsed into that object
    (templates render arguments with `tojson`); other messages are returned as they are."""
    return [_parsed_calls(message) if message.get("tool_calls") else message for message in messages]


def _parsed_calls(message: dict) -> dict:
    calls = []
    for call in message["tool_calls"]:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            try:
                value = json.loads(arguments)
            except (ValueError, RecursionError):  # rendered as sent
                value = None
            if isinstance(value, dict):
                call = {**call, "function": {**function, "arguments": value}}
        calls.append(call)
    return {**message, "tool_calls": calls}

"""The policy service: the engine serving now, the episodes' token contexts, and the recorder.

`complete(request, trajectory_id)` runs one chat completion (in a worker thread): it takes the
engine serving at that moment (so one response never mixes versions, even while a reload swaps
the engine), builds the prompt token-in (producers/policy/turns.py), samples, parses tool calls,
records the step through the SDK's no-loss delivery (spooled when the broker is down) and returns
the OpenAI response body with its `policy_version`. With `client_records=True` the step is not
published: the same `step_event` fields go back in the body's `agentstream` object (`client_fields`)
for the caller to record with its observation.

`tool_choice`: with `required` or a named function the template's call opening is appended to the
prompt as tokens (`force_call`) and starts the returned answer; with `none` the model sees the tools
as on other turns (the prompt, and so token continuity, stays the same) and any call it writes
comes back as text (`answer`). A streamed completion (`Stream`, producers/policy/chat_stream.py)
is this same completion with a callback per token; its client leaving before it is sampled in full
leaves nothing recorded.

Bounds (issue #34): a prompt that with `max_tokens` does not fit the model's context length is
refused with OpenAI's `context_length_exceeded` before any model work: first by a lower bound of its
token count taken from its size (`precheck`, on the event loop: a 4 MB prompt never reaches the
tokenizer), then exactly once it is tokenised. The episodes' token contexts are bounded in tokens
(`Episodes`). Redaction reaches the tokens: a step whose prompt or completion holds a secret is
recorded without token ids or logprobs and marked not token-trainable (`withhold_tokens`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from producers.errors import ProducerError
from producers.policy.api_errors import ApiError
from producers.policy.engine.sampling import cut_at_stop
from producers.policy.requests import ChatRequest, TokenRequest, check_context, context_exceeded
from producers.policy.tool_calls import ParsedCompletion, call_opening, parse
from producers.policy.turns import Episodes, Prompt, build_prompt
from producers.redaction import Redactor, withhold_tokens
from schemas.events import StepRecorded, utc_now
from schemas.ids import new_event_id

log = logging.getLogger(__name__)

PRODUCER = "policy-server"


@dataclass(frozen=True)
class Stream:
    """What a streamed completion adds: the engine chosen when the response started (its version is
    in the headers already), `on_token(choice_index, token_id)` called from the generating thread,
    and `abandoned`, set by the server when the client has gone. A completion whose client is gone
    once it is sampled is not recorded at all: the episode's step count and token context stay as
    they were, so the client's retry of the same turn is that step, continuous with the turn before.
    Once recorded, the remaining writes to a client that goes do not undo it."""

    engine: object | None = None
    on_token: Callable[[int, int], None] | None = None
    abandoned: threading.Event = field(default_factory=threading.Event)


class StreamAbandoned(ProducerError):
    """Raised from `on_token` once a stream's client has gone: the engine ends that request (and
    frees its slot) instead of sampling to max_tokens for no one; nothing is recorded."""


@dataclass(frozen=True)
class Completion:
    body: dict
    policy_version: str
    recorded: bool


class PolicyService:
    """Serves `engine` (swapped by `swap` on reload) and records with `recorder` (None: off)."""

    def __init__(
        self,
        engine,
        recorder=None,
        redactor: Redactor | None = None,
        episode_context_tokens: int = 8 * 1024 * 1024,
    ):
        self._engine = engine
        self.recorder = recorder
        self.redactor = redactor or getattr(recorder, "redactor", None) or Redactor.default()
        self.episodes = Episodes(token_budget=episode_context_tokens)
        self.tokens_withheld = 0  # steps recorded without their token ids (a secret in them)
        self._swap_lock = threading.Lock()

    @property
    def engine(self):
        return self._engine

    def swap(self, engine) -> None:
        """Serve `engine` from the next request on; requests already running finish on the old one."""
        with self._swap_lock:
            old, self._engine = self._engine, engine
        log.info("policy: now serving %s (was %s)", engine.version, old.version)

    def models(self) -> set[str]:
        return {self._engine.model_name, "policy"}

    def precheck(self, request: ChatRequest) -> None:
        """Refuse, without tokenising, a request whose messages alone are surely too long: their
        UTF-8 size over the most bytes one token can stand for is a lower bound of their tokens
        (over 3 more: a normaliser may shorten text, NFC composes at most 3 bytes into 1)."""
        engine = self._engine
        limit, longest = getattr(engine, "context_length", None), getattr(engine, "longest_token_bytes", None)
        if limit is None or not longest:
            return
        size = sum(_message_bytes(m) for m in request.messages)
        tools = len(json.dumps(request.tools, ensure_ascii=False).encode()) if request.tools else 0
        at_least = (size + tools) // (longest * 3)
        if at_least + request.sampling.max_tokens > limit:
            param = "messages" if size >= tools else "tools"
            raise context_exceeded(limit, at_least, request.sampling.max_tokens, param)

    def complete(
        self,
        request: ChatRequest,
        trajectory_id: str | None,
        step_index: int | None = None,
        client_records: bool = False,
        stream: Stream | None = None,
    ) -> Completion:
        """One completion (see the module docstring); blocking: run it in a worker thread.
        `step_index`: the client's own count of the episode's steps (kept across a server restart),
        else the server counts the episode's turns from 0. `client_records`: return the step's
        fields in the body's `agentstream` object instead of publishing them. `stream`: the engine
        to use, a callback per sampled token, and the event set when the client is gone (see
        `Stream`)."""
        engine = stream.engine if stream and stream.engine else self._engine  # one version per response
        if trajectory_id is None:
            prompt = build_prompt(engine, request.messages, request.tools, [])
            prompt, request = force_call(engine, request, prompt)
            samples, latency_ms = _generate(engine, prompt, request, stream)
            return Completion(
                response_body(engine, request, prompt, samples), version_of(engine, samples), False
            )
        state = self.episodes.get(trajectory_id)
        with state.lock:  # the turns of one episode run in order
            prompt = build_prompt(engine, request.messages, request.tools, state.contexts, state.histories)
            prompt, request = force_call(engine, request, prompt)
            samples, latency_ms = _generate(engine, prompt, request, stream)
            if stream and stream.abandoned.is_set():  # the client left: as if never asked (see Stream)
                body = response_body(engine, request, prompt, samples)
                return Completion(body, version_of(engine, samples), False)
            step_index = state.next_step if step_index is None else step_index
            state.next_step = step_index + 1
            body = response_body(engine, request, prompt, samples)  # its messages: what the next turn matches
            replies = [choice["message"] for choice in body["choices"]]
            self.episodes.store(
                trajectory_id, state, [[*prompt.token_ids, *s.token_ids] for s in samples], replies, prompt
            )
        event = step_event(engine, request, prompt, samples, trajectory_id, step_index, latency_ms)
        event = self._redacted(engine, prompt, event)
        recorded = False
        if client_records:
            body["agentstream"] = client_fields(event)
        elif self.recorder is not None:
            self.recorder.publish(event)
            recorded = True
        return Completion(body, version_of(engine, samples), recorded)

    def complete_tokens(self, request: TokenRequest) -> Completion:
        """`/v1/completions`, token in and token out (what the recording proxy calls upstream);
        not recorded: the proxy in front records."""
        engine = self._engine
        limit = getattr(engine, "context_length", None)
        check_context(limit, len(request.prompt_ids), request.sampling.max_tokens, "prompt")
        samples = engine.generate(request.prompt_ids, request.sampling)
        return Completion(token_body(engine, request, samples), version_of(engine, samples), False)

    def _redacted(self, engine, prompt: Prompt, event: StepRecorded) -> StepRecorded:
        """`event` redacted as the recorder would (its token ids withheld when its text held a
        secret), and withheld too when the prompt the model saw holds one: the token ids of a
        prompt are its text. Done here, not only in the recorder, so that client-records replies
        carry no secret's tokens either."""
        event = self.redactor.redact_event(event)
        if event.token_ids is not None and self.redactor.enabled:
            found = self.redactor.redact_text(engine.decode(list(prompt.token_ids)))[1]
            if found:
                event = withhold_tokens(event, found)
        if event.token_ids is None:
            with self._swap_lock:
                self.tokens_withheld += 1
        return event


def token_body(engine, request: TokenRequest, samples) -> dict:
    """The OpenAI `text_completion` body with vLLM's fields: `token_ids` per choice and
    `prompt_token_ids` (unless `return_token_ids` is false), the sampled tokens' logprobs always,
    `logprobs` alternatives per token as `{token: logprob}` (keyed `token_id:N` with
    `return_tokens_as_token_ids`, so no token text has to be mapped back), and the text decoded with
    or without special tokens (`skip_special_tokens`), cut before a stop string."""
    choices = []
    for index, sample in enumerate(samples):
        choice = {
            "index": index,
            "text": _completion_text(engine, request, sample),
            "finish_reason": sample.finish_reason,
            "logprobs": _token_logprobs(engine, request, sample),
        }
        if request.return_token_ids:
            choice["token_ids"] = sample.token_ids
        choices.append(choice)
    body = {
        **_head("cmpl", "text_completion", request.model),
        "policy_version": version_of(engine, samples),
        "choices": choices,
        "usage": usage(len(request.prompt_ids), samples),
    }
    if request.return_token_ids:
        body["prompt_token_ids"] = request.prompt_ids
    return body


def _completion_text(engine, request: TokenRequest, sample) -> str:
    if request.skip_special_tokens:
        return sample.text
    with engine.tokenizer_lock:
        text = engine.tokenizer.decode(sample.token_ids, skip_special_tokens=False)
    return cut_at_stop(text, request.sampling.stop)[0]


def _token_logprobs(engine, request: TokenRequest, sample) -> dict:
    def name(token_id: int) -> str:
        return f"token_id:{token_id}" if request.tokens_as_ids else engine.decode([token_id])

    tokens = [name(t) for t in sample.token_ids]
    logprobs = {"tokens": tokens, "token_logprobs": sample.logprobs, "top_logprobs": None}
    if request.logprobs:
        alternatives = _alternatives(sample, request.logprobs, "logprobs")
        logprobs["top_logprobs"] = [{name(i): lp for i, lp in entries} for entries in alternatives]
    return logprobs


def _head(id_prefix: str, kind: str, model: str) -> dict:
    """The fields every OpenAI response body starts with: a fresh id, its object kind, the time, the model."""
    return {
        "id": f"{id_prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
    }


def version_of(engine, samples) -> str:
    """The policy version that produced `samples` (the upstream's, in proxy mode)."""
    return samples[0].policy_version or engine.version


def _message_bytes(message: dict) -> int:
    """The UTF-8 size of what a message puts in the prompt: its text and its calls' names and arguments."""
    size = len(message["content"].encode())
    for call in message.get("tool_calls") or ():
        function = call["function"]
        arguments = function.get("arguments", "")
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        size += len(function["name"].encode()) + len(text.encode())
    return size


def _generate(engine, prompt: Prompt, request: ChatRequest, stream: Stream | None = None):
    limit = getattr(engine, "context_length", None)
    check_context(limit, len(prompt.token_ids), request.sampling.max_tokens, "messages")
    started = time.perf_counter()
    if stream is not None and stream.on_token is not None:
        relay, abandoned = stream.on_token, stream.abandoned

        def on_token(choice: int, token: int) -> None:
            if abandoned.is_set():  # fails this request only: the engine stops sampling it
                raise StreamAbandoned("the client left the stream")
            relay(choice, token)

        samples = engine.generate(prompt.token_ids, request.sampling, on_token=on_token)
    else:
        samples = engine.generate(prompt.token_ids, request.sampling)
    return samples, (time.perf_counter() - started) * 1000.0


def force_call(engine, request: ChatRequest, prompt: Prompt) -> tuple[Prompt, ChatRequest]:
    """For `tool_choice` required or a named function: the prompt with the template's call opening
    (`tool_calls.call_opening`) appended as tokens, so the model continues a call; the request then
    carries the opening (`request.opening`), which starts every returned and recorded answer. The
    opening's tokens are the prompt's (`prompt_token_ids`), never the completion's. Else unchanged."""
    if request.tool_choice not in ("required", "function"):
        return prompt, request

    def render(messages: list[dict], generation: bool) -> str:
        return engine.tokenizer.apply_chat_template(
            messages, tools=request.tools, add_generation_prompt=generation, tokenize=False
        )

    with engine.tokenizer_lock:
        opening = call_opening(render, request.tool_name)
        forced = engine.tokenizer.encode(opening, add_special_tokens=False) if opening else []
    if not opening:
        raise ApiError(
            400,
            f"tool_choice: {request.tool_choice} cannot be forced with this model's chat template (it does "
            "not write a call as a name then an arguments object); use auto",
            "tool_choice",
        )
    delta = replace(prompt.delta, token_ids=[*prompt.delta.token_ids, *forced])
    return replace(prompt, token_ids=[*prompt.token_ids, *forced], delta=delta), replace(
        request, opening=opening
    )


def answer(request: ChatRequest, sample) -> ParsedCompletion:
    """What a sample says as the client gets it: the forced opening and the sampled text, its tool
    calls parsed, except with `tool_choice` none: then the text as written, calls included (the
    model saw the tools, as on every other turn, so the prompt stays the same across turns)."""
    text = request.opening + sample.text
    return ParsedCompletion(text) if request.tool_choice == "none" else parse(text)


def step_event(
    engine,
    request: ChatRequest,
    prompt: Prompt,
    samples,
    trajectory_id: str,
    step_index: int,
    latency_ms: float,
):
    """The `step.recorded` of one turn: sample 0 as the step, the others in `samples`."""
    first = samples[0]
    parsed = answer(request, first)
    call = parsed.calls[0] if parsed.calls else None
    delta = prompt.delta
    return StepRecorded(
        event_id=new_event_id(),
        trajectory_id=trajectory_id,
        occurred_at=utc_now(),
        producer=PRODUCER,
        step_index=step_index,
        thought=parsed.text,
        tool=call.name if call else "",
        params=call.arguments if call else {},
        model=engine.model_name,
        policy_version=version_of(engine, samples),
        input_tokens=len(prompt.token_ids),
        output_tokens=len(first.token_ids),
        latency_ms=round(latency_ms, 3),
        token_ids=first.token_ids,
        logprobs=first.logprobs,
        prompt_token_ids=delta.token_ids,
        prompt_delta_start=delta.start,
        sampling=request.sampling.as_dict(),
        tokenizer_hash=engine.tokenizer_hash,
        token_continuity=delta.continuity,
        token_continuity_break=delta.break_at,
        token_rl_eligible=delta.rl_eligible,
        finish_reason=_finish_reason(first, parsed),
        tool_call_malformed=parsed.malformed,
        samples=[_sample_dict(s) for s in samples[1:]] or None,
    )


CLIENT_FIELDS = (
    "token_ids",
    "logprobs",
    "prompt_token_ids",
    "prompt_delta_start",
    "token_continuity",
    "token_continuity_break",
    "token_rl_eligible",
    "sampling",
    "tokenizer_hash",
    "policy_version",
    "finish_reason",
    "tool_call_malformed",
    "input_tokens",
    "output_tokens",
    "latency_ms",
    "step_index",
)


def client_fields(event: StepRecorded) -> dict:
    """What the server would have recorded, for a client that records the step itself."""
    return {name: getattr(event, name) for name in CLIENT_FIELDS}


def _sample_dict(sample) -> dict:
    return {
        "token_ids": sample.token_ids,
        "logprobs": sample.logprobs,
        "finish_reason": sample.finish_reason,
        "text": sample.text,
    }


def usage(prompt_tokens: int, samples) -> dict:
    """OpenAI `usage`: the prompt once, every sample's completion tokens."""
    completion_tokens = sum(len(s.token_ids) for s in samples)
    total = prompt_tokens + completion_tokens
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": total}


def _finish_reason(sample, parsed: ParsedCompletion) -> str:
    return "tool_calls" if parsed.calls else sample.finish_reason


def response_body(engine, request: ChatRequest, prompt: Prompt, samples) -> dict:
    """The OpenAI `chat.completion` body (plus `policy_version`)."""
    choices = [_choice(engine, request, index, sample) for index, sample in enumerate(samples)]
    return {
        **_head("chatcmpl", "chat.completion", request.model),
        "system_fingerprint": engine.tokenizer_hash,
        "policy_version": version_of(engine, samples),
        "choices": choices,
        "usage": usage(len(prompt.token_ids), samples),
    }


def _choice(engine, request: ChatRequest, index: int, sample) -> dict:
    parsed = answer(request, sample)
    message: dict = {"role": "assistant", "content": parsed.text if parsed.text or not parsed.calls else None}
    if parsed.calls:
        message["tool_calls"] = [call.openai(f"call_{uuid.uuid4().hex[:24]}") for call in parsed.calls]
    if parsed.malformed:
        message["tool_call_malformed"] = True
    choice = {"index": index, "message": message, "finish_reason": _finish_reason(sample, parsed)}
    choice["logprobs"] = _logprobs(engine, sample, request.top_logprobs) if request.logprobs else None
    return choice


def _logprobs(engine, sample, top: int) -> dict:
    """OpenAI chat `logprobs`: per sampled token its logprob and the `top` most likely alternatives
    (`Sample.top_logprobs`, from the same raw log-softmax)."""
    alternatives = _alternatives(sample, top, "top_logprobs")
    content = []
    for position, (token_id, logprob) in enumerate(zip(sample.token_ids, sample.logprobs, strict=True)):
        entry = _token_entry(engine, token_id, logprob)
        entry["top_logprobs"] = [_token_entry(engine, i, lp) for i, lp in alternatives[position]]
        content.append(entry)
    return {"content": content}


def _token_entry(engine, token_id: int, logprob: float) -> dict:
    token = engine.decode([token_id])
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def _alternatives(sample, top: int, param: str) -> list[list[tuple[int, float]]]:
    """Per token, its `top` alternatives; an engine that asked for them and has none is a bug, never
    answered as "no alternatives"."""
    if not top:
        return [[] for _ in sample.token_ids]
    given = sample.top_logprobs
    if given is None or len(given) != len(sample.token_ids):
        raise ApiError(500, f"{param}: the engine returned no alternatives", param, "server_error")
    return [list(entries)[:top] for entries in given]

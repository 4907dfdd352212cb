"""The policy service: the engine serving now, the episodes' token contexts, and the recorder.

`complete(request, trajectory_id)` runs one chat completion (in a worker thread): it takes the
engine serving at that moment (so one response never mixes versions, even while a reload swaps
the engine), builds the prompt token-in (producers/policy/turns.py), samples, parses tool calls,
records the step through the SDK's no-loss delivery (spooled when the broker is down) and returns
the OpenAI response body with its `policy_version`. With `client_records=True` the step is not
published: the same `step_event` fields go back in the body's `agentstream` object (`client_fields`)
for the caller to record with its observation.

Bounds (issue #34): a prompt that with `max_tokens` does not fit the model's context length is
refused with OpenAI's `context_length_exceeded` before any model work: first by a lower bound of its
token count taken from its size (`precheck`, on the event loop: a 4 MB prompt never reaches the
tokenizer), then exactly once it is tokenised. The episodes' token contexts are bounded in tokens
(`Episodes`). Redaction reaches the tokens: a step whose prompt or completion holds a secret is
recorded without token ids or logprobs and marked not token-trainable (`withhold_tokens`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass

from producers.policy.requests import ChatRequest, TokenRequest, check_context, context_exceeded
from producers.policy.tool_calls import ParsedCompletion, parse
from producers.policy.turns import Episodes, Prompt, build_prompt
from producers.redaction import Redactor, withhold_tokens
from schemas.events import StepRecorded, utc_now
from schemas.ids import new_event_id

log = logging.getLogger(__name__)

PRODUCER = "policy-server"


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
        size = sum(len(m["content"].encode()) for m in request.messages)
        at_least = size // (longest * 3)
        if at_least + request.sampling.max_tokens > limit:
            raise context_exceeded(limit, at_least, request.sampling.max_tokens, "messages")

    def complete(
        self,
        request: ChatRequest,
        trajectory_id: str | None,
        step_index: int | None = None,
        client_records: bool = False,
    ) -> Completion:
        """One completion (see the module docstring); blocking: run it in a worker thread.
        `step_index`: the client's own count of the episode's steps (kept across a server restart),
        else the server counts the episode's turns from 0. `client_records`: return the step's
        fields in the body's `agentstream` object instead of publishing them."""
        engine = self._engine  # one version for the whole response
        if trajectory_id is None:
            prompt = build_prompt(engine, request.messages, request.tools, [])
            samples, latency_ms = _generate(engine, prompt, request)
            return Completion(
                response_body(engine, request, prompt, samples), version_of(engine, samples), False
            )
        state = self.episodes.get(trajectory_id)
        with state.lock:  # the turns of one episode run in order
            prompt = build_prompt(engine, request.messages, request.tools, state.contexts)
            samples, latency_ms = _generate(engine, prompt, request)
            step_index = state.next_step if step_index is None else step_index
            state.next_step = step_index + 1
            self.episodes.store(trajectory_id, state, [[*prompt.token_ids, *s.token_ids] for s in samples])
        event = step_event(engine, request, prompt, samples, trajectory_id, step_index, latency_ms)
        event = self._redacted(engine, prompt, event)
        body = response_body(engine, request, prompt, samples)
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
        return Completion(token_body(engine, request, samples), engine.version, False)

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
    """The OpenAI `text_completion` body with vLLM's `token_ids` / `prompt_token_ids` fields."""
    choices = [
        {
            "index": index,
            "text": sample.text,
            "token_ids": sample.token_ids,
            "finish_reason": sample.finish_reason,
            "logprobs": {
                "tokens": [engine.decode([t]) for t in sample.token_ids],
                "token_logprobs": sample.logprobs,
            },
        }
        for index, sample in enumerate(samples)
    ]
    return {
        **_head("cmpl", "text_completion", request.model),
        "policy_version": engine.version,
        "prompt_token_ids": request.prompt_ids,
        "choices": choices,
        "usage": usage(len(request.prompt_ids), samples),
    }


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


def _generate(engine, prompt: Prompt, request: ChatRequest):
    limit = getattr(engine, "context_length", None)
    check_context(limit, len(prompt.token_ids), request.sampling.max_tokens, "messages")
    started = time.perf_counter()
    samples = engine.generate(prompt.token_ids, request.sampling)
    return samples, (time.perf_counter() - started) * 1000.0


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
    parsed = parse(first.text)
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
    parsed = parse(sample.text)
    message: dict = {"role": "assistant", "content": parsed.text if parsed.text or not parsed.calls else None}
    if parsed.calls:
        message["tool_calls"] = [call.openai(f"call_{uuid.uuid4().hex[:24]}") for call in parsed.calls]
    if parsed.malformed:
        message["tool_call_malformed"] = True
    choice = {"index": index, "message": message, "finish_reason": _finish_reason(sample, parsed)}
    choice["logprobs"] = _logprobs(engine, sample) if request.logprobs else None
    return choice


def _logprobs(engine, sample) -> dict:
    content = []
    for token_id, logprob in zip(sample.token_ids, sample.logprobs, strict=True):
        token = engine.decode([token_id])
        content.append(
            {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}
        )
    return {"content": content}

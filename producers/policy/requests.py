"""The policy server's pure core: its configuration, and an OpenAI request -> checked values or an
OpenAI-style error naming the field and the value. No model, no I/O.

Errors are `ApiError`s (api_errors.py): an HTTP status and the OpenAI error body
`{"error": {"message", "type", "param", "code"}}`, so the real `openai` SDK raises its own
`BadRequestError` / `NotFoundError` / `AuthenticationError` with our message. Which fields are
honoured, accepted at their default only, or refused is in openai_fields.py.

Every value a request can send is checked here, so that nothing the client chose reaches the
chat template or the sampler in a shape they cannot take (a 500 before): message content is a
string or a list of text parts, `tool_calls` a list of function calls, sampling parameters numbers
in OpenAI's ranges, and a message field the template cannot show is refused unless null. A
temperature below `MIN_TEMPERATURE` is greedy decoding (its limit; dividing logits by 1e-300
overflows), as vLLM does; a tiny `top_p` keeps the most likely token. `top_k` 0 or -1 (vLLM's
"off") keeps every token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from producers.errors import ProducerError
from producers.gateway.requests import check_key_hashes, parse_key_hashes
from producers.policy.api_errors import ApiError, bad, preview
from producers.policy.engine.sampling import MIN_TEMPERATURE, SamplingParams
from producers.policy.openai_fields import (
    CHAT,
    COMPLETIONS,
    MAX_TOP_LOGPROBS,
    bool_field,
    check_fields,
    check_json,
    float_field,
    function_name,
    int_field,
    response_format,
    stop_strings,
    stream_settings,
    tool_choice,
)
from schemas.config_fields import check_bounds, option

MAX_N = 16
MAX_TOKENS_LIMIT = 4096
MAX_SAMPLED = 262144  # n x max_tokens x (1 + top_logprobs): what one request may make the server produce
ROLES = {"system", "user", "assistant", "tool", "developer"}
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
AUTO_WORKERS = 32  # generation threads when `workers` is 0


@dataclass(frozen=True)
class PolicyConfig:
    """How `agentstream policy` serves and records. Documented fields are its options."""

    base_model: str = option(
        "tiny",
        "base model: a local directory, or `tiny` (built from a config under --data-dir); one setting "
        "with `agentstream train` and `agentstream batch` (docs/operations.md, One base model)",
        env="AGENTSTREAM_BASE_MODEL",
        old_env="AGENTSTREAM_POLICY_BASE_MODEL",
    )
    adapter: str = option(
        "",
        "LoRA checkpoint to serve at start (default: the latest under --checkpoints)",
        env="AGENTSTREAM_POLICY_ADAPTER",
    )
    checkpoints: str = option(
        "",
        "the executor's checkpoint root (default: <data-dir>/checkpoints)",
        env="AGENTSTREAM_POLICY_CHECKPOINTS",
    )
    upstream: str = option(
        "",
        "proxy mode: an OpenAI-compatible server to sample from (vLLM, SGLang, another agentstream "
        "policy), e.g. http://127.0.0.1:8000 (with or without /v1); --base-model then names the model's "
        "tokenizer directory",
        env="AGENTSTREAM_POLICY_UPSTREAM",
    )
    upstream_keep_versions: int = option(
        2,
        "proxy mode: LoRA versions kept loaded in the upstream; older ones are unloaded once no request "
        "uses them (the version serving never is)",
        env="AGENTSTREAM_POLICY_UPSTREAM_KEEP_VERSIONS",
        ge=1,
    )
    device: str = option("auto", "auto | cpu | cuda", env="AGENTSTREAM_POLICY_DEVICE")
    record: bool = option(True, "record each completion as step.recorded", env="AGENTSTREAM_POLICY_RECORD")
    follow: bool = option(True, "reload on policy.updated (hot reload)", env="AGENTSTREAM_POLICY_FOLLOW")
    api_key_hashes: frozenset[str] | tuple[str, ...] = option(
        (),
        "comma-separated sha256 hex digests of accepted API keys (`agentstream gateway-key KEY`); "
        "none: no key needed",
        env="AGENTSTREAM_POLICY_API_KEY_HASHES",
    )
    max_body_bytes: int = option(
        4 * 1024 * 1024, "request size limit (413 above)", env="AGENTSTREAM_POLICY_MAX_BODY_BYTES"
    )
    workers: int = option(
        0,
        "generation threads: completions in flight at once (one model instance is shared); 0: "
        f"{AUTO_WORKERS} (the built-in engine decodes concurrent requests together, a proxy's upstream "
        "batches them)",
        env="AGENTSTREAM_POLICY_WORKERS",
        ge=0,
    )
    allowed_hosts: tuple[str, ...] = option(
        (),
        "comma-separated Host header values accepted besides the loopback names with the bound port "
        "(e.g. policy.internal:8000, or a name alone for any port); others get 421",
        env="AGENTSTREAM_POLICY_ALLOWED_HOSTS",
    )
    episode_context_tokens: int = option(
        8 * 1024 * 1024,
        "token ids kept for the episodes' token continuity, all episodes together (4 bytes each); the "
        "least recently used episode's context is dropped beyond it",
        env="AGENTSTREAM_POLICY_EPISODE_CONTEXT_TOKENS",
        ge=0,
    )

    def __post_init__(self):
        object.__setattr__(self, "api_key_hashes", parse_key_hashes(self.api_key_hashes))
        check_key_hashes(self.api_key_hashes)
        check_bounds(self, ProducerError)
        hosts = self.allowed_hosts
        hosts = hosts.split(",") if isinstance(hosts, str) else hosts
        object.__setattr__(self, "allowed_hosts", tuple(h.strip().lower() for h in hosts if h.strip()))

    def generation_threads(self) -> int:
        """The generation threads to run: `workers`, or `AUTO_WORKERS` for 0."""
        return self.workers or AUTO_WORKERS

    def check_exposure(self, host: str) -> None:
        """Refuse to serve a non-loopback address without API keys: anyone who can reach the port
        could sample the model and write steps into the log (ProducerError naming the address)."""
        if host not in LOOPBACK_HOSTS and not self.api_key_hashes:
            raise ProducerError(
                f"host={host!r}: a policy server reachable beyond this machine needs API keys "
                "(--api-key-hashes or AGENTSTREAM_POLICY_API_KEY_HASHES, comma-separated sha256 hex "
                "from `agentstream gateway-key KEY`); refusing to start without one"
            )


def context_exceeded(context_length: int, prompt_tokens: int, max_tokens: int, param: str) -> ApiError:
    """OpenAI's answer to a prompt that, with the completion asked for, does not fit the model.
    `prompt_tokens` may be a lower bound ("at least"), counted before rendering."""
    return ApiError(
        400,
        f"{param}: this model's maximum context length is {context_length} tokens, but "
        f"{prompt_tokens + max_tokens} were requested ({prompt_tokens} in the prompt, {max_tokens} "
        "for the completion: max_tokens); shorten the prompt or lower max_tokens",
        param,
        code="context_length_exceeded",
    )


def check_context(context_length: int | None, prompt_tokens: int, max_tokens: int, param: str) -> None:
    """Raise `context_exceeded` when prompt + max_tokens is over the model's context length.

    >>> check_context(4096, 4032, 64, "messages")
    >>> try:
    ...     check_context(4096, 4040, 64, "messages")
    ... except ApiError as exc:
    ...     print(exc.status, exc.code)
    400 context_length_exceeded
    """
    if context_length is not None and prompt_tokens + max_tokens > context_length:
        raise context_exceeded(context_length, prompt_tokens, max_tokens, param)


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat completions request. `tool_choice`: none | auto | required | function (then
    `tool_name` is the function's name); `sampling` carries `stop` and `top_logprobs`."""

    model: str
    messages: list[dict]
    tools: list[dict] | None
    sampling: SamplingParams
    logprobs: bool
    top_logprobs: int
    tool_choice: str = "auto"
    tool_name: str | None = None
    stream: bool = False
    include_usage: bool = False
    opening: str = ""  # the tool-call opening forced after the prompt (set by the service)


def parse_chat(body: Any, models: set[str]) -> ChatRequest:
    """Check an OpenAI chat completions body; raises ApiError (400 / 404) naming the field. Every
    field is honoured or refused (`openai_fields.CHAT`)."""
    if not isinstance(body, dict):
        raise bad("body", body, "a JSON object")
    model = _model(body, models)
    check_fields(body, CHAT)
    tools = _tools(body.get("tools"))
    choice, name = tool_choice(body.get("tool_choice"), tools)
    response_format(body.get("response_format"))
    stream, include_usage = stream_settings(body)
    logprobs = bool_field(body, "logprobs", False)
    top = int_field(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if top and not logprobs:
        raise ApiError(400, f"top_logprobs: {top} needs logprobs: true", "top_logprobs")
    sampling = _sampling(body, _max_tokens(body), top)
    _check_amplification(sampling)
    return ChatRequest(
        model=model,
        messages=_messages(body.get("messages")),
        tools=tools,
        sampling=sampling,
        logprobs=logprobs,
        top_logprobs=top,
        tool_choice=choice,
        tool_name=name,
        stream=stream,
        include_usage=include_usage,
    )


@dataclass(frozen=True)
class TokenRequest:
    """`/v1/completions` with the prompt as token ids (token-in, as vLLM and SGLang accept it).
    `logprobs`: alternatives per token asked (None: not asked; the sampled tokens' logprobs are
    returned anyway); the other flags are vLLM's fields of the same names."""

    model: str
    prompt_ids: list[int]
    sampling: SamplingParams
    logprobs: int | None = None
    return_token_ids: bool = True
    tokens_as_ids: bool = False
    skip_special_tokens: bool = True


def parse_completion(body: Any, models: set[str], vocab_size: int) -> TokenRequest:
    """Check a completions body whose `prompt` is a list of token ids; ApiError naming the field.
    Every field is honoured or refused (`openai_fields.COMPLETIONS`)."""
    if not isinstance(body, dict):
        raise bad("body", body, "a JSON object")
    model = _model(body, models)
    check_fields(body, COMPLETIONS)
    prompt = body.get("prompt")
    if (
        not isinstance(prompt, list)
        or not prompt
        or not all(type(t) is int and 0 <= t < vocab_size for t in prompt)
    ):
        raise bad("prompt", prompt, f"a non-empty list of token ids in [0, {vocab_size})")
    logprobs = int_field(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)
    max_tokens = int_field(body, "max_tokens", 64, 1, MAX_TOKENS_LIMIT)
    return TokenRequest(
        model=model,
        prompt_ids=prompt,
        sampling=_sampling(body, max_tokens, logprobs or 0),
        logprobs=logprobs,
        return_token_ids=bool_field(body, "return_token_ids", True),
        tokens_as_ids=bool_field(body, "return_tokens_as_token_ids", False),
        skip_special_tokens=bool_field(body, "skip_special_tokens", True),
    )


def _model(body: dict, models: set[str]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", model, "a model id")
    if model not in models:
        raise ApiError(
            404,
            f"model: {preview(model)} is not served here (serving {sorted(models)})",
            "model",
            "not_found_error",
        )
    return model


def _messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise bad("messages", messages, "a non-empty list of messages")
    return [_message(message, f"messages[{index}]") for index, message in enumerate(messages)]


MESSAGE_FIELDS = ("role", "content", "tool_calls", "tool_call_id")
# the server's own flag on a reply whose call did not parse: accepted back on an assistant message
# (true, false or null), not part of what the message says
MALFORMED_FLAG = "tool_call_malformed"
# OpenAI message fields the chat template cannot show: accepted as null (what a client sends back
# from `message.model_dump()`), refused with a value
MESSAGE_NULL_FIELDS = ("name", "refusal", "audio", "function_call", "annotations")


def _message(message: Any, where: str) -> dict:
    """A message as the chat template reads it (text parts joined), after checking every field:
    the template's fields, OpenAI's others only when null (or empty), anything else refused."""
    if not isinstance(message, dict):
        raise bad(where, message, "an object with role and content")
    if not isinstance(message.get("role"), str) or message["role"] not in ROLES:
        raise bad(f"{where}.role", message.get("role"), f"one of {sorted(ROLES)}")
    for name, value in message.items():
        if name in MESSAGE_FIELDS or (name in MESSAGE_NULL_FIELDS and value in (None, [])):
            continue
        if name == MALFORMED_FLAG:
            if message["role"] == "assistant" and (value is None or isinstance(value, bool)):
                continue
            raise bad(f"{where}.{name}", value, "true, false or null, on an assistant message only")
        known = name in MESSAGE_NULL_FIELDS
        raise ApiError(
            400,
            f"{where}.{preview(name, 60)}: "
            + (f"not supported by this server (the chat template cannot show it), got {preview(value)}; "
               "leave it out" if known else f"unknown message field (accepted: {', '.join(MESSAGE_FIELDS)})"),
            f"{where}.{name[:60]}",
        )  # fmt: skip
    plain = {"role": message["role"], "content": _content(message.get("content"), f"{where}.content")}
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        calls = _tool_calls(tool_calls, f"{where}.tool_calls")
        if calls:
            plain["tool_calls"] = calls
    tool_call_id = message.get("tool_call_id")
    if tool_call_id is not None and not isinstance(tool_call_id, str):
        raise bad(f"{where}.tool_call_id", tool_call_id, "a string")
    if tool_call_id:
        plain["tool_call_id"] = tool_call_id
    return plain


def _content(content: Any, where: str) -> str:
    """A string, null, or a list of text parts (`{"type": "text", "text": ...}`), joined: the
    model reads text only."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise bad(where, content, "a string, a list of text parts or null")
    texts = []
    for index, part in enumerate(content):
        if (
            not isinstance(part, dict)
            or part.get("type", "text") != "text"
            or not isinstance(part.get("text"), str)
        ):
            raise bad(f"{where}[{index}]", part, 'a text part {"type": "text", "text": "..."}')
        texts.append(part["text"])
    return "".join(texts)


def _tool_calls(calls: Any, where: str) -> list[dict]:
    """OpenAI `tool_calls`: function calls with a name and arguments (a JSON string or an object)."""
    if not isinstance(calls, list):
        raise bad(where, calls, "a list of tool calls")
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(function, dict)
            or call.get("type", "function") != "function"
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments", "{}"), str | dict)
        ):
            raise bad(
                f"{where}[{index}]",
                call,
                'a tool call {"type": "function", "function": {"name": "...", "arguments": "{...}"}}',
            )
        at = f"{where}[{index}].function"
        function_name(function["name"], f"{at}.name", reserved=False)
        _arguments(function.get("arguments"), f"{at}.arguments")
    return calls


def _arguments(arguments: Any, where: str) -> None:
    """Tool-call arguments as the template and the meaning digest read them: an object, or a string
    that is parsed as JSON when it is JSON (else kept as text), in either case no deeper than
    `MAX_JSON_DEPTH` and without a lone surrogate (a `\\ud800` escape that json.loads turns into one)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except RecursionError:
            raise ApiError(400, f"{where}: nested too deep to parse; not accepted", where) from None
        except ValueError:  # not JSON: text, which the body's parser has checked already
            return
    check_json(arguments, where)


def _tools(tools: Any) -> list[dict] | None:
    """OpenAI `tools`: function tools, passed to the chat template whole. `strict: true` is refused
    (no constrained decoding here: the arguments are not held to the schema)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad("tools", tools, "a list of tools")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(function, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(function.get("name"), str)
        ):
            raise bad(f"tools[{index}]", tool, 'an object {"type": "function", "function": {"name", ...}}')
        function_name(function["name"], f"tools[{index}].function.name")
        for key, value in function.items():
            check_json(value, f"tools[{index}].function.{key[:60]}")
        check_json(tool, f"tools[{index}]")
        if function.get("strict") not in (None, False):
            raise ApiError(
                400,
                f"tools[{index}].function.strict: not supported by this server (no constrained decoding: "
                "the arguments are not held to the schema); leave it out or send false",
                f"tools[{index}].function.strict",
            )
    return tools or None


def _max_tokens(body: dict) -> int:
    """`max_completion_tokens` or its older name `max_tokens` (both: the same value)."""
    given = {
        name: int_field(body, name, None, 1, MAX_TOKENS_LIMIT)
        for name in ("max_completion_tokens", "max_tokens")
        if body.get(name) is not None
    }  # each checked first: `True == 1` and `1.0 == 1`
    if len(given) == 2 and given["max_tokens"] != given["max_completion_tokens"]:
        raise ApiError(
            400,
            f"max_tokens: {preview(given['max_tokens'])} differs from max_completion_tokens "
            f"{preview(given['max_completion_tokens'])}; send one of them",
            "max_tokens",
        )
    value = given.get("max_completion_tokens", given.get("max_tokens"))
    return int_field({"max_tokens": value}, "max_tokens", 64, 1, MAX_TOKENS_LIMIT)


def _check_amplification(sampling: SamplingParams) -> None:
    """Refuse a request whose choices x tokens x (1 + alternatives) is over `MAX_SAMPLED`: each is in
    range alone, but together they ask for what one client should not make the server produce."""
    n, max_tokens, top = sampling.n, sampling.max_tokens, sampling.top_logprobs
    product = n * max_tokens * (1 + top)
    if product > MAX_SAMPLED:
        raise ApiError(
            400,
            f"n, max_tokens, top_logprobs: n x max_tokens x (1 + top_logprobs) = {n} x {max_tokens} x "
            f"(1 + {top}) = {product} is over {MAX_SAMPLED}; ask for fewer choices, tokens or alternatives",
            "n",
        )


def _sampling(body: dict, max_tokens: int, top_logprobs: int) -> SamplingParams:
    temperature = float_field(body, "temperature", 1.0, 0.0, 2.0)
    return SamplingParams(
        temperature=temperature if temperature >= MIN_TEMPERATURE else 0.0,  # greedy: its limit
        top_p=float_field(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=max(int_field(body, "top_k", 0, -1, 1_000_000), 0),  # -1: vLLM's "off", as 0
        max_tokens=max_tokens,
        seed=int_field(body, "seed", None, -(2**63), 2**63 - 1),
        n=int_field(body, "n", 1, 1, MAX_N),
        stop=stop_strings(body.get("stop")),
        top_logprobs=top_logprobs,
    )

"""The policy server's pure core: its configuration, and an OpenAI chat request -> checked values
or an OpenAI-style error naming the field and the value. No model, no I/O.

Errors are `ApiError`s: an HTTP status and the OpenAI error body
`{"error": {"message", "type", "param", "code"}}`, so the real `openai` SDK raises its own
`BadRequestError` / `NotFoundError` / `AuthenticationError` with our message.

Every value a request can send is checked here, so that nothing the client chose reaches the
chat template or the sampler in a shape they cannot take (a 500 before): message content is a
string or a list of text parts, `tool_calls` a list of function calls, sampling parameters numbers
in OpenAI's ranges. A temperature below `MIN_TEMPERATURE` is greedy decoding (its limit; dividing
logits by 1e-300 overflows), as vLLM does; a tiny `top_p` keeps the most likely token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from producers.errors import ProducerError
from producers.gateway.requests import check_key_hashes, parse_key_hashes
from producers.policy.engine.sampling import MIN_TEMPERATURE, SamplingParams
from schemas.config_fields import check_bounds, option

MAX_N = 16
MAX_TOKENS_LIMIT = 4096
ROLES = {"system", "user", "assistant", "tool", "developer"}
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class PolicyConfig:
    """How `agentstream policy` serves and records. Documented fields are its options."""

    base_model: str = option(
        "tiny",
        "base model: a local directory, or `tiny` (built from a config under --data-dir)",
        env="AGENTSTREAM_POLICY_BASE_MODEL",
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
        "policy), e.g. http://127.0.0.1:8000/v1; --base-model then names the model's tokenizer directory",
        env="AGENTSTREAM_POLICY_UPSTREAM",
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
        1, "generation threads (one model instance is shared)", env="AGENTSTREAM_POLICY_WORKERS", ge=1
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

    def check_exposure(self, host: str) -> None:
        """Refuse to serve a non-loopback address without API keys: anyone who can reach the port
        could sample the model and write steps into the log (ProducerError naming the address)."""
        if host not in LOOPBACK_HOSTS and not self.api_key_hashes:
            raise ProducerError(
                f"host={host!r}: a policy server reachable beyond this machine needs API keys "
                "(--api-key-hashes or AGENTSTREAM_POLICY_API_KEY_HASHES, comma-separated sha256 hex "
                "from `agentstream gateway-key KEY`); refusing to start without one"
            )


class ApiError(ProducerError):
    """A request the server answers with an OpenAI-style error."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return {"error": error}


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


def bad(param: str, value: Any, expected: str) -> ApiError:
    return ApiError(400, f"{param}: expected {expected}, got {_preview(value)}", param)


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict]
    tools: list[dict] | None
    sampling: SamplingParams
    logprobs: bool
    top_logprobs: int


def parse_chat(body: Any, models: set[str]) -> ChatRequest:
    """Check an OpenAI chat completions body; raises ApiError (400 / 404) naming the field."""
    if not isinstance(body, dict):
        raise bad("body", body, "a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", model, "a model id")
    if model not in models:
        raise ApiError(
            404, f"model: {model!r} is not served here (serving {sorted(models)})", "model", "not_found_error"
        )
    return ChatRequest(
        model=model,
        messages=_messages(body.get("messages")),
        tools=_tools(body.get("tools")),
        sampling=_sampling(body),
        logprobs=_bool(body, "logprobs", False),
        top_logprobs=_int(body, "top_logprobs", 0, 0, 20),
    )


@dataclass(frozen=True)
class TokenRequest:
    """`/v1/completions` with the prompt as token ids (token-in, as vLLM and SGLang accept it)."""

    model: str
    prompt_ids: list[int]
    sampling: SamplingParams


def parse_completion(body: Any, models: set[str], vocab_size: int) -> TokenRequest:
    """Check a completions body whose `prompt` is a list of token ids; ApiError naming the field."""
    if not isinstance(body, dict):
        raise bad("body", body, "a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or model not in models:
        raise ApiError(
            404, f"model: {model!r} is not served here (serving {sorted(models)})", "model", "not_found_error"
        )
    prompt = body.get("prompt")
    if (
        not isinstance(prompt, list)
        or not prompt
        or not all(type(t) is int and 0 <= t < vocab_size for t in prompt)
    ):
        raise bad("prompt", prompt, f"a non-empty list of token ids in [0, {vocab_size})")
    return TokenRequest(model=model, prompt_ids=prompt, sampling=_sampling(body))


def _messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise bad("messages", messages, "a non-empty list of messages")
    return [_message(message, f"messages[{index}]") for index, message in enumerate(messages)]


def _message(message: Any, where: str) -> dict:
    """A message as the chat template reads it (text parts joined, OpenAI-only fields dropped),
    after checking every field the template reads."""
    if not isinstance(message, dict):
        raise bad(where, message, "an object with role and content")
    if not isinstance(message.get("role"), str) or message["role"] not in ROLES:
        raise bad(f"{where}.role", message.get("role"), f"one of {sorted(ROLES)}")
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
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments", "{}"), str | dict)
        ):
            raise bad(
                f"{where}[{index}]",
                call,
                'a tool call {"type": "function", "function": {"name": "...", "arguments": "{...}"}}',
            )
    return calls


def _tools(tools: Any) -> list[dict] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad("tools", tools, "a list of tools")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad(f"tools[{index}]", tool, 'an object {"type": "function", "function": {"name", ...}}')
    return tools or None


def _sampling(body: dict) -> SamplingParams:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    temperature = _float(body, "temperature", 1.0, 0.0, 2.0)
    return SamplingParams(
        temperature=temperature if temperature >= MIN_TEMPERATURE else 0.0,  # greedy: its limit
        top_p=_float(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=_int(body, "top_k", 0, 0, 1_000_000),
        max_tokens=_int({"max_tokens": max_tokens}, "max_tokens", 64, 1, MAX_TOKENS_LIMIT),
        seed=_int(body, "seed", None, -(2**63), 2**63 - 1),
        n=_int(body, "n", 1, 1, MAX_N),
    )


def _float(body: dict, name: str, default, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(name, value, f"a number in [{low}, {high}]")
    if value > high or value < low or (low_open and value <= low):
        raise bad(name, value, f"a number in {'(' if low_open else '['}{low}, {high}]")
    return float(value)


def _int(body: dict, name: str, default, low: int, high: int):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad(name, value, f"an integer in [{low}, {high}]")
    return value


def _bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(name, value, "true or false")
    return value


def _preview(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."

"""The policy server's pure core: its configuration, and an OpenAI chat request -> checked values
or an OpenAI-style error naming the field and the value. No model, no I/O.

Errors are `ApiError`s: an HTTP status and the OpenAI error body
`{"error": {"message", "type", "param", "code"}}`, so the real `openai` SDK raises its own
`BadRequestError` / `NotFoundError` / `AuthenticationError` with our message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from producers.errors import ProducerError
from producers.gateway_requests import check_key_hashes, parse_key_hashes
from producers.policy.engine import SamplingParams

MAX_N = 16
MAX_TOKENS_LIMIT = 4096
ROLES = {"system", "user", "assistant", "tool", "developer"}


@dataclass(frozen=True)
class PolicyConfig:
    """How `agentstream policy` serves and records. Documented fields are its options."""

    base_model: str = field(
        default="tiny",
        metadata={
            "env": "AGENTSTREAM_POLICY_BASE_MODEL",
            "help": "base model: a local directory, or `tiny` (built from a config under --data-dir)",
        },
    )
    adapter: str = field(
        default="",
        metadata={
            "env": "AGENTSTREAM_POLICY_ADAPTER",
            "help": "LoRA checkpoint to serve at start (default: the latest under --checkpoints)",
        },
    )
    checkpoints: str = field(
        default="",
        metadata={
            "env": "AGENTSTREAM_POLICY_CHECKPOINTS",
            "help": "the executor's checkpoint root (default: <data-dir>/checkpoints)",
        },
    )
    upstream: str = field(
        default="",
        metadata={
            "env": "AGENTSTREAM_POLICY_UPSTREAM",
            "help": "proxy mode: an OpenAI-compatible server to sample from (vLLM, SGLang, another "
            "agentstream policy), e.g. http://127.0.0.1:8000/v1; --base-model then names the model's "
            "tokenizer directory",
        },
    )
    device: str = field(
        default="auto", metadata={"env": "AGENTSTREAM_POLICY_DEVICE", "help": "auto | cpu | cuda"}
    )
    record: bool = field(
        default=True,
        metadata={"env": "AGENTSTREAM_POLICY_RECORD", "help": "record each completion as step.recorded"},
    )
    follow: bool = field(
        default=True,
        metadata={"env": "AGENTSTREAM_POLICY_FOLLOW", "help": "reload on policy.updated (hot reload)"},
    )
    api_key_hashes: frozenset[str] | tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "comma-separated sha256 hex digests of accepted API keys "
            "(`agentstream gateway-key KEY`); none: no key needed",
            "env": "AGENTSTREAM_POLICY_API_KEY_HASHES",
        },
    )
    max_body_bytes: int = field(
        default=4 * 1024 * 1024,
        metadata={"env": "AGENTSTREAM_POLICY_MAX_BODY_BYTES", "help": "request size limit (413 above)"},
    )
    workers: int = field(
        default=1,
        metadata={
            "env": "AGENTSTREAM_POLICY_WORKERS",
            "help": "generation threads (one model instance is shared)",
        },
    )

    def __post_init__(self):
        object.__setattr__(self, "api_key_hashes", parse_key_hashes(self.api_key_hashes))
        check_key_hashes(self.api_key_hashes)
        if self.workers < 1:
            raise ProducerError(f"workers: expected at least 1, got {self.workers}")


class ApiError(ProducerError):
    """A request the server answers with an OpenAI-style error."""

    def __init__(
        self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


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
    if model not in models:
        raise ApiError(
            404, f"model: {model!r} is not served here (serving {sorted(models)})", "model", "not_found_error"
        )
    prompt = body.get("prompt")
    if (
        not isinstance(prompt, list)
        or not prompt
        or not all(isinstance(t, int) and 0 <= t < vocab_size for t in prompt)
    ):
        raise bad("prompt", prompt, f"a non-empty list of token ids in [0, {vocab_size})")
    return TokenRequest(model=model, prompt_ids=prompt, sampling=_sampling(body))


def _messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise bad("messages", messages, "a non-empty list of messages")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad(where, message, "an object with role and content")
        if message.get("role") not in ROLES:
            raise bad(f"{where}.role", message.get("role"), f"one of {sorted(ROLES)}")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise bad(f"{where}.content", content, "a string, a list of parts or null")
    return [_plain(message) for message in messages]


def _plain(message: dict) -> dict:
    """A message as the chat template reads it: text parts joined, OpenAI-only fields dropped."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    plain = {"role": message["role"], "content": content or ""}
    if message.get("tool_calls"):
        plain["tool_calls"] = message["tool_calls"]
    if message.get("tool_call_id"):
        plain["tool_call_id"] = message["tool_call_id"]
    return plain


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
    return SamplingParams(
        temperature=_float(body, "temperature", 1.0, 0.0, 2.0),
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

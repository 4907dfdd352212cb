"""Which OpenAI request fields the policy server honours, which it takes only at their default, and
which it refuses; and the checks of the fields that are more than a number. Pure: no model, no I/O.

A field is never dropped silently: either it is honoured, or its value changes nothing here and it
is accepted only at that default (another value is a 400 saying what is supported), or it is
refused (a 400 naming it). `null` is the same as leaving a field out (OpenAI's rule), for every
field the API knows; a name the API does not know is a 400 whatever its value (a typo is not
ignored).

`POST /v1/chat/completions` (`CHAT`):
- honoured: `model`, `messages`, `tools`, `tool_choice` (`none`, `auto`, `required`, a named
  function), `n`, `temperature`, `top_p`, `top_k` (vLLM's), `max_tokens`, `max_completion_tokens`,
  `seed`, `logprobs`, `top_logprobs` (0..20, with `logprobs: true`), `stream`, `stream_options`
  (`include_usage`; `include_obfuscation` false only), `stop` (a string or up to 4),
  `response_format` (`{"type": "text"}` only: json_object and json_schema are refused, there is no
  constrained decoding here);
- at their default only: `frequency_penalty` 0, `presence_penalty` 0, `logit_bias` {},
  `parallel_tool_calls` true, `store` false, `metadata` {}, `modalities` ["text"], `service_tier`
  "auto", and vLLM's `min_p` 0 and `repetition_penalty` 1;
- refused: `functions`, `function_call` (use `tools` / `tool_choice`), `audio`, `prediction`,
  `reasoning_effort`, `verbosity`, `web_search_options`, `user`, `safety_identifier`,
  `prompt_cache_key`.

`POST /v1/completions` with token ids (`COMPLETIONS`):
- honoured: `model`, `prompt`, `max_tokens`, `temperature`, `top_p`, `top_k`, `n`, `seed`,
  `logprobs` (0..20 alternatives per token; the sampled tokens' logprobs are always returned),
  `stop`, and vLLM's `return_token_ids` (default true here), `return_tokens_as_token_ids` and
  `skip_special_tokens`;
- at their default only: `echo` false, `stream` false, `best_of` equal to `n`, `frequency_penalty`
  0, `presence_penalty` 0, `logit_bias` {}, `min_p` 0, `repetition_penalty` 1;
- refused: `suffix`, `user`, `stream_options`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from producers.policy.api_errors import ApiError, bad, preview

MAX_STOP = 4  # OpenAI's limit
MAX_STOP_CHARS = 1000
MAX_TOP_LOGPROBS = 20
TOOL_CHOICES = ("none", "auto", "required")
MAX_JSON_DEPTH = 64  # tools and tool-call arguments: far below Python's recursion limit
FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's ^[a-zA-Z0-9_-]{1,64}$
RESERVED_NAME = "agentstream_probe"  # tool_calls.call_opening renders the template with such names
_SURROGATE = re.compile("[\ud800-\udfff]")

# name -> (is the value the default?, the default as the message says it)
Defaults = dict[str, tuple[Callable[[Any, dict], bool], str]]


def _zero(value: Any, _body: dict) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0


@dataclass(frozen=True)
class FieldTable:
    """The fields of one endpoint: honoured, accepted at their default only, refused (with why)."""

    endpoint: str
    honoured: frozenset[str]
    defaults: Defaults = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


# vLLM's sampling extensions at their neutral values (what a client written for vLLM may send)
VLLM_DEFAULTS: Defaults = {
    "min_p": (_zero, "0"),
    "repetition_penalty": (lambda v, _: type(v) in (int, float) and v == 1, "1"),
}

CHAT_HONOURED = ("model", "messages", "tools", "tool_choice", "n", "temperature", "top_p", "top_k",
                 "max_tokens", "max_completion_tokens", "seed", "logprobs", "top_logprobs", "stream",
                 "stream_options", "stop", "response_format")  # fmt: skip
COMPLETIONS_HONOURED = ("model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "seed",
                        "logprobs", "stop", "return_token_ids", "return_tokens_as_token_ids",
                        "skip_special_tokens")  # fmt: skip

CHAT = FieldTable(
    "/v1/chat/completions",
    frozenset(CHAT_HONOURED),
    {
        "frequency_penalty": (_zero, "0"),
        "presence_penalty": (_zero, "0"),
        "logit_bias": (lambda v, _: v == {}, "{}"),
        "parallel_tool_calls": (lambda v, _: v is True, "true"),
        "store": (lambda v, _: v is False, "false (nothing is stored for later retrieval)"),
        "metadata": (lambda v, _: v == {}, "{} (it only goes with store)"),
        "modalities": (lambda v, _: v == ["text"], '["text"]'),
        "service_tier": (lambda v, _: v == "auto", '"auto"'),
        **VLLM_DEFAULTS,
    },
    {
        "functions": "deprecated by OpenAI: use tools",
        "function_call": "deprecated by OpenAI: use tool_choice",
        "audio": "the model reads and writes text only",
        "prediction": "no predicted outputs here",
        "reasoning_effort": "the model has no reasoning-effort setting",
        "verbosity": "the model has no verbosity setting",
        "web_search_options": "no web search here",
        "user": "no per-user abuse monitoring here; name the episode in the URL instead",
        "safety_identifier": "no per-user abuse monitoring here",
        "prompt_cache_key": "no prompt cache here",
    },
)

COMPLETIONS = FieldTable(
    "/v1/completions",
    frozenset(COMPLETIONS_HONOURED),
    {
        "echo": (lambda v, _: v is False, "false"),
        "stream": (lambda v, _: v is False, "false (token-in completions are not streamed)"),
        "best_of": (
            lambda v, body: type(v) is int and v == (body.get("n") or 1),
            "n (one sample per choice)",
        ),
        "frequency_penalty": (_zero, "0"),
        "presence_penalty": (_zero, "0"),
        "logit_bias": (lambda v, _: v == {}, "{}"),
        **VLLM_DEFAULTS,
    },
    {
        "suffix": "no insertion here",
        "user": "no per-user abuse monitoring here",
        "stream_options": "token-in completions are not streamed",
    },
)


def check_fields(body: dict, table: FieldTable) -> None:
    """Raise the 400 of the first field of `body` that `table` does not honour (see the module
    docstring), naming it in `param`.

    >>> check_fields({"model": "m", "frequency_penalty": 0, "user": None}, CHAT)
    >>> try:
    ...     check_fields({"model": "m", "logit_bias": {"5": 3}}, CHAT)
    ... except ApiError as exc:
    ...     print(exc.param, "|", exc.message)
    logit_bias | logit_bias: only {} is supported by this server, got {'5': 3}
    """
    for name, value in body.items():
        if name in table.honoured:
            continue
        shown = preview(name, 60)
        if name in table.defaults:
            is_default, default = table.defaults[name]
            if value is not None and not is_default(value, body):
                message = f"{name}: only {default} is supported by this server, got {preview(value)}"
                raise ApiError(400, message, name)
        elif name in table.refused:
            if value is not None:
                message = f"{name}: not supported by this server ({table.refused[name]}); leave it out"
                raise ApiError(400, message, name)
        else:
            accepted = ", ".join(sorted([*table.honoured, *table.defaults]))
            message = f"{shown}: unknown field for {table.endpoint} (accepted: {accepted})"
            raise ApiError(400, message, name[:60])


def stop_strings(value: Any) -> tuple[str, ...]:
    """OpenAI `stop`: a string or a list of up to `MAX_STOP` strings, each non-empty.

    >>> stop_strings("\\n"), stop_strings(["a", "b"]), stop_strings(None)
    (('\\n',), ('a', 'b'), ())
    """
    if value is None:
        return ()
    values = [value] if isinstance(value, str) else value
    if (
        not isinstance(values, list)
        or len(values) > MAX_STOP
        or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in values)
    ):
        raise bad(
            "stop",
            value,
            f"a string or a list of up to {MAX_STOP} strings of 1 to {MAX_STOP_CHARS} characters",
        )
    return tuple(dict.fromkeys(values))


def tool_choice(value: Any, tools: list[dict] | None) -> tuple[str, str | None]:
    """OpenAI `tool_choice` as (`none` | `auto` | `required` | `function`, the function's name).
    `required` and a named function need `tools`; the name must be one of them.

    >>> tool_choice(None, None), tool_choice("required", [{"function": {"name": "bash"}}])
    (('auto', None), ('required', None))
    >>> tool_choice({"type": "function", "function": {"name": "bash"}}, [{"function": {"name": "bash"}}])
    ('function', 'bash')
    """
    if value is None:
        return "auto", None
    if isinstance(value, str) and value in TOOL_CHOICES:
        if value == "required" and not tools:
            raise ApiError(
                400, "tool_choice: 'required' needs tools, and the request has none", "tool_choice"
            )
        return value, None
    function = value.get("function") if isinstance(value, dict) else None
    if (
        not isinstance(value, dict)
        or value.get("type") != "function"
        or set(value) - {"type", "function"}
        or not isinstance(function, dict)
        or set(function) != {"name"}
        or not isinstance(function["name"], str)
    ):
        raise bad(
            "tool_choice", value, 'none, auto, required or {"type": "function", "function": {"name": "..."}}'
        )
    function_name(function["name"], "tool_choice")
    names = [tool["function"]["name"] for tool in tools or []]
    if function["name"] not in names:
        raise ApiError(
            400,
            f"tool_choice: the function {preview(function['name'])} is not one of the request's tools "
            f"({preview(names)})",
            "tool_choice",
        )
    return "function", function["name"]


def json_problem(value: Any) -> str | None:
    """What makes `value` (parsed JSON) unfit for the chat template and the meaning digest, or None:
    nesting deeper than `MAX_JSON_DEPTH` (json.dumps and the template's tojson recurse: a
    RecursionError), or a string or key holding a lone surrogate (`"\\ud800"` in a JSON string that
    `json.loads` read: not UTF-8 text).

    >>> json_problem({"a": [1, "x"]}), json_problem(["\\ud800"])
    (None, 'a string holding a lone surrogate (not UTF-8 text)')
    >>> deep = []
    >>> for _ in range(64):
    ...     deep = [deep]
    >>> json_problem(deep[0]), json_problem(deep)
    (None, 'nested deeper than 64 levels')
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and _SURROGATE.search(item):
                return "a string holding a lone surrogate (not UTF-8 text)"
        elif isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                return f"nested deeper than {MAX_JSON_DEPTH} levels"
            if isinstance(item, dict):
                stack.extend((key, depth) for key in item)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return None


def check_json(value: Any, where: str) -> None:
    """Raise a 400 naming `where` when `json_problem(value)` finds one."""
    problem = json_problem(value)
    if problem is not None:
        raise ApiError(400, f"{where}: {problem}; not accepted", where)


def function_name(name: Any, where: str, reserved: bool = True) -> str:
    """A function name as OpenAI has it (`^[a-zA-Z0-9_-]{1,64}$`): a chat template writes it raw
    into the call's JSON, so a quote or a tag in it breaks every call. `reserved`: also refuse names
    holding `RESERVED_NAME` (the server's own probe of the template).

    >>> function_name("bash_2", "tools[0].function.name")
    'bash_2'
    >>> try:
    ...     function_name('a"b', "tools[0].function.name")
    ... except ApiError as exc:
    ...     print(exc.param)
    tools[0].function.name
    """
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise bad(where, name, "a function name of 1 to 64 letters, digits, _ or - (^[a-zA-Z0-9_-]{1,64}$)")
    if reserved and RESERVED_NAME in name:
        raise ApiError(
            400,
            f"{where}: {preview(name)} is reserved here (the server renders the chat template with "
            f"{RESERVED_NAME}_* names to learn how it writes a call); choose another name",
            where,
        )
    return name


def response_format(value: Any) -> None:
    """OpenAI `response_format`: `{"type": "text"}` (the default) only; JSON modes are refused."""
    kind = value.get("type") if isinstance(value, dict) else None
    if value is None or (kind == "text" and set(value) == {"type"}):
        return
    if kind in ("json_object", "json_schema"):
        raise ApiError(
            400,
            f"response_format: {kind} is not supported by this server (no constrained decoding); "
            'leave it out or send {"type": "text"}, and ask for JSON in the prompt',
            "response_format",
        )
    raise bad("response_format", value, '{"type": "text"}')


def stream_settings(body: dict) -> tuple[bool, bool]:
    """(`stream`, `stream_options.include_usage`); `stream_options` only with `stream: true`
    (OpenAI's rule).

    >>> stream_settings({"stream": True, "stream_options": {"include_usage": True}})
    (True, True)
    """
    stream = bool_field(body, "stream", False)
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise ApiError(400, "stream_options: only allowed with stream: true", "stream_options")
    if not isinstance(options, dict):
        raise bad("stream_options", options, 'an object {"include_usage": true}')
    for name, value in options.items():
        if name == "include_obfuscation" and value in (False, None):
            continue
        if name != "include_usage":
            raise ApiError(
                400,
                f"stream_options.{preview(name, 60)}: not supported by this server (include_usage only; "
                "include_obfuscation false)",
                "stream_options",
            )
    return stream, bool_field(options, "include_usage", False, "stream_options.include_usage")


def float_field(body: dict, name: str, default, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(name, value, f"a number in [{low}, {high}]")
    if value > high or value < low or (low_open and value <= low):
        raise bad(name, value, f"a number in {'(' if low_open else '['}{low}, {high}]")
    return float(value)


def int_field(body: dict, name: str, default, low: int, high: int):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad(name, value, f"an integer in [{low}, {high}]")
    return value


def bool_field(body: dict, name: str, default: bool, param: str | None = None) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(param or name, value, "true or false")
    return value

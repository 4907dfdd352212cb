"""The proxy's wire format with its upstream (vLLM's OpenAI-compatible API), as pure functions: the
`--upstream` URL, the `/v1/completions` body asked for a token-in request, and the reply checked and
turned into `Sample`s. No HTTP here (upstream.py does the calls), no model.

    UpstreamError (ApiError, EngineError)   the upstream cannot be reached or answered badly: the
                                            client gets it as an OpenAI-style 502/503/504 naming it

What a reply must hold: per choice the sampled `token_ids` (vLLM's `return_token_ids`) and their
`logprobs.token_logprobs` (vLLM's logprobs are the raw model's, before temperature and top-k/top-p,
as the built-in engine records them), and when alternatives were asked `logprobs.top_logprobs` as
`{"token_id:N": logprob}` dicts (vLLM's `return_tokens_as_token_ids`), so no token string has to be
mapped back to an id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import urlsplit

from producers.policy.api_errors import ApiError
from producers.policy.engine.errors import EngineError
from producers.policy.engine.sampling import Sample, SamplingParams, cut_at_stop

FINISH_REASONS = ("stop", "length")
TOKEN_ID_PREFIX = "token_id:"
POLICY_ALIAS = "policy"  # an agentstream server's alias of its model
AGENTSTREAM_OWNER = "agentstream"  # `owned_by` of an agentstream policy server's models
NEUTRAL_SAMPLING = {
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


class UpstreamModels(NamedTuple):
    base: str
    adapters: tuple[str, ...]
    max_model_len: int | None
    owned_by: str


class UpstreamError(ApiError, EngineError):
    """The upstream failed a request: answered with `status` (502 bad answer, 503 unreachable, 504
    too slow), OpenAI-style, with a message naming the upstream."""

    def __init__(self, status: int, message: str):
        super().__init__(status, message, None, "server_error", "upstream_error")


def api_base(url: str) -> str:
    """The upstream's OpenAI API base (`.../v1`) from `--upstream`, given with or without `/v1`.

    >>> api_base("http://127.0.0.1:8000"), api_base("http://127.0.0.1:8000/")
    ('http://127.0.0.1:8000/v1', 'http://127.0.0.1:8000/v1')
    >>> api_base("http://h:8000/v1"), api_base("https://h/v1/"), api_base("http://h:1/vllm/v1")
    ('http://h:8000/v1', 'https://h/v1', 'http://h:1/vllm/v1')
    >>> for bad in ("ftp://h:8000", "http://h:8000/v1?x=1", "http://h:8000/v1/models", "http://h/./v1",
    ...             "http://h:0"):
    ...     try:
    ...         api_base(bad)
    ...     except EngineError as exc:
    ...         print(str(exc)[:52])
    --upstream: expected an http:// or https:// URL (e.g
    --upstream: a base URL takes no query or fragment, g
    --upstream: a base URL ends at /v1 (an endpoint such
    --upstream: a base URL has no '.' or '..' path segme
    --upstream: port 0 names no server (e.g. http://127.
    """
    shown = repr(url[:200])
    expected = "(e.g. http://127.0.0.1:8000 or http://127.0.0.1:8000/v1)"
    if not url.isprintable() or any(c.isspace() for c in url):
        raise EngineError(f"--upstream: expected a URL without spaces or control characters, got {shown}")
    try:
        parts = urlsplit(url)
        port = parts.port  # a port that is not a number raises here
    except ValueError as exc:
        raise EngineError(f"--upstream: not a URL ({exc}), got {shown}") from None
    if parts.scheme not in ("http", "https"):
        raise EngineError(f"--upstream: expected an http:// or https:// URL {expected}, got {shown}")
    if not parts.hostname:
        raise EngineError(f"--upstream: the URL names no host {expected}, got {shown}")
    if parts.username is not None or parts.password is not None:  # never echo a password
        host = parts.hostname
        raise EngineError(f"--upstream: a URL with credentials (user@) is not supported, got host {host!r}")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise EngineError(f"--upstream: a base URL takes no query or fragment, got {shown}")
    if port == 0:
        raise EngineError(f"--upstream: port 0 names no server {expected}, got {shown}")
    path = parts.path.rstrip("/")
    if any(segment in (".", "..") for segment in path.split("/")):
        raise EngineError(f"--upstream: a base URL has no '.' or '..' path segments {expected}, got {shown}")
    if "v1" in path.split("/")[:-1]:
        endpoint = "an endpoint such as /v1/chat/completions or /v1/models is not one"
        raise EngineError(f"--upstream: a base URL ends at /v1 ({endpoint}) {expected}, got {shown}")
    path = path[: -len("/v1")] if path.endswith("/v1") else path
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = host if port is None else f"{host}:{port}"
    return f"{parts.scheme}://{netloc}{path}/v1"


def completion_body(model: str, prompt_ids: list[int], params: SamplingParams, neutral: bool = True) -> dict:
    """The `/v1/completions` request for `params.n` samples of `prompt_ids` on `model`. `neutral`:
    also the neutral values of the sampling fields vLLM and SGLang would otherwise take from the
    model's `generation_config.json` (a Qwen's top_k 20 and repetition_penalty 1.05, say), so the
    upstream samples with exactly the parameters recorded (an agentstream upstream has no such
    defaults and refuses fields it does not know).

    >>> body = completion_body("v3", [1, 2], SamplingParams(max_tokens=4, seed=7, stop=("!",)))
    >>> body["model"], body["prompt"], body["seed"], body["stop"], body["logprobs"], body["top_k"]
    ('v3', [1, 2], 7, ['!'], 1, 0)
    >>> "repetition_penalty" in completion_body("v3", [1], SamplingParams(), neutral=False)
    False
    """
    body = {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "n": params.n,
        "logprobs": max(1, params.top_logprobs),  # vLLM adds the sampled token's when it is not in them
        "return_token_ids": True,  # vLLM >= 0.10.2; SGLang and agentstream policy return them too
        "return_tokens_as_token_ids": True,  # top_logprobs keyed "token_id:N", not by token text
    }
    if params.top_k or neutral:
        body["top_k"] = params.top_k  # 0: off, for vLLM and SGLang as for the built-in engine
    if neutral:
        body |= NEUTRAL_SAMPLING
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    return body


def read_models(payload: object, upstream: str) -> UpstreamModels:
    """What `GET /v1/models` says: the base model (the first without a `parent`, not agentstream's
    `policy` alias), the adapters loaded (those with one), its context length and owner.

    >>> read_models({"data": [{"id": "m", "owned_by": "vllm", "max_model_len": 1024},
    ...                       {"id": "v1", "parent": "m"}]}, "u")
    UpstreamModels(base='m', adapters=('v1',), max_model_len=1024, owned_by='vllm')
    """
    data = payload.get("data") if isinstance(payload, dict) else None
    models = [m for m in data or [] if isinstance(m, dict) and isinstance(m.get("id"), str)]
    bases = [m for m in models if not m.get("parent")]
    named = [m for m in bases if m["id"] != POLICY_ALIAS] or bases
    if not named:
        raise EngineError(f"--upstream {upstream}: lists no base model (GET /models)")
    limit = named[0].get("max_model_len")
    return UpstreamModels(
        named[0]["id"],
        tuple(m["id"] for m in models if m.get("parent")),
        limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None,
        str(named[0].get("owned_by") or ""),
    )


def samples_of(
    payload: object, params: SamplingParams, decode: Callable[[list[int]], str], version: str, upstream: str
) -> list[Sample]:
    """The `Sample`s of a `/v1/completions` reply, checked: `params.n` choices in index order, each
    with token ids and as many logprobs (and `params.top_logprobs` alternatives per token when
    asked). `Sample.text` is the tokens decoded with `decode`, cut before the first stop string."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or len(choices) != params.n:
        got = len(choices) if isinstance(choices, list) else type(choices).__name__
        raise UpstreamError(502, f"upstream {upstream}: expected {params.n} choices, got {got}")
    ordered = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
    return [_sample(choice, params, decode, version, upstream) for choice in ordered]


def _sample(
    choice: object, params: SamplingParams, decode: Callable[[list[int]], str], version: str, upstream: str
) -> Sample:
    choice = choice if isinstance(choice, dict) else {}
    token_ids = choice.get("token_ids")
    logprobs = choice.get("logprobs") if isinstance(choice.get("logprobs"), dict) else {}
    values = logprobs.get("token_logprobs")
    if not _ints(token_ids) or not _numbers(values) or len(token_ids) != len(values):
        raise UpstreamError(
            502,
            f"upstream {upstream}: the reply has no sampled token ids with as many logprobs (a vLLM "
            ">= 0.10.2 or SGLang server answers return_token_ids and logprobs)",
        )
    finish = choice.get("finish_reason")
    if finish not in FINISH_REASONS:
        raise UpstreamError(
            502, f"upstream {upstream}: finish_reason {str(finish)[:40]!r} is not stop or length"
        )
    top = None
    if params.top_logprobs:
        entries = logprobs.get("top_logprobs") or []
        top = [top_alternatives(entry, params.top_logprobs, upstream) for entry in entries]
        if len(top) != len(token_ids):
            raise UpstreamError(
                502, f"upstream {upstream}: top_logprobs has {len(top)} entries for {len(token_ids)} tokens"
            )
    text, _ = cut_at_stop(decode(token_ids), tuple(params.stop))
    return Sample(list(token_ids), [float(x) for x in values], finish, text, version, top)


def top_alternatives(entry: object, k: int, upstream: str) -> list[tuple[int, float]]:
    """The `k` most likely (token id, logprob) of one vLLM `top_logprobs` dict, most likely first.

    >>> top_alternatives({"token_id:5": -0.1, "token_id:9": -3.0, "token_id:2": -2.5}, 2, "u")
    [(5, -0.1), (2, -2.5)]
    """
    if not isinstance(entry, dict):
        raise UpstreamError(502, f"upstream {upstream}: a top_logprobs entry is not an object")
    pairs = []
    for key, value in entry.items():
        named = isinstance(key, str) and key.startswith(TOKEN_ID_PREFIX)
        digits = key[len(TOKEN_ID_PREFIX) :] if named else ""
        if not (digits.isascii() and digits.isdigit()) or not _numbers([value]):
            raise UpstreamError(
                502,
                f"upstream {upstream}: a top_logprobs key is {str(key)[:40]!r} (expected token_id:N: "
                "return_tokens_as_token_ids)",
            )
        pairs.append((int(digits), float(value)))
    return sorted(pairs, key=lambda pair: -pair[1])[:k]


def _ints(values: object) -> bool:
    """A list of token ids (`type() is int`: not a bool; what a JSON reply holds)."""
    return isinstance(values, list) and all(type(v) is int and v >= 0 for v in values)


def _numbers(values: object) -> bool:
    """A list of numbers, none NaN (`v == v`)."""
    return isinstance(values, list) and all(type(v) in (int, float) and v == v for v in values)

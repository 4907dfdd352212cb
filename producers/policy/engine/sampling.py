"""How the engine samples: `SamplingParams`, the `Sample` it returns, the token pick of every row of a
batched step (`pick_rows`: temperature, top-k, top-p, each request's own generator), and stop
strings (`cut_at_stop`). The decode loop itself is the scheduler's (`batching`).

torch is imported inside the functions that need it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Below this temperature sampling is greedy decoding, its limit (vLLM's floor too): logits divided
# by 1e-300 overflow to inf and the softmax to NaN.
MIN_TEMPERATURE = 1e-5
MAX_STOPS = 4  # OpenAI's limit
MAX_TOP_LOGPROBS = 20  # OpenAI's limit


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: temperature scaling, then top-k, then top-p (nucleus) filtering; when to stop
    (`max_tokens`, a stop token, or a `stop` string in the decoded text); how many alternatives to
    report per token (`top_logprobs`)."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_tokens: int = 64
    seed: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()  # OpenAI stop strings; a str is one stop string
    top_logprobs: int = 0  # alternatives per token, 0..20

    def __post_init__(self) -> None:
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if isinstance(stop, list):
            stop = tuple(stop)
        object.__setattr__(self, "stop", stop)
        checks = {
            "temperature": self.temperature >= 0,
            "top_p": 0 < self.top_p <= 1,
            "top_k": self.top_k >= 0,
            "max_tokens": self.max_tokens >= 1,
            "n": self.n >= 1,
            "stop": isinstance(stop, tuple)
            and len(stop) <= MAX_STOPS
            and all(isinstance(s, str) and s for s in stop),
            "top_logprobs": type(self.top_logprobs) is int and 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
        }
        for field, ok in checks.items():
            if not ok:
                raise ValueError(f"SamplingParams.{field}: invalid value {getattr(self, field)!r}")

    def as_dict(self) -> dict:
        """The parameters as a plain dict, for recording next to the samples."""
        values = asdict(self)
        values["stop"] = list(self.stop)
        return values


@dataclass(frozen=True)
class Sample:
    """One completion: its tokens (with the final stop token when one was generated) and logprobs."""

    token_ids: list[int]
    logprobs: list[float]  # log-softmax of the raw fp32 logits at each sampled token
    finish_reason: str  # "stop" (a stop token or stop string) or "length" (max_tokens)
    text: str  # decoded without special tokens, cut before the first stop string
    policy_version: str | None = None  # set by engines that learn it per call (the upstream proxy)
    # per token, the `top_logprobs` most likely (token id, logprob) of the raw fp32 log-softmax,
    # most likely first; None when not asked
    top_logprobs: list[list[tuple[int, float]]] | None = None


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """`text` before the first stop string that occurs in it, and whether one did.

    >>> cut_at_stop("a = 1\\nEND\\nb", ("END", "\\n"))
    ('a = 1', True)
    >>> cut_at_stop("no stop here", ("END",))
    ('no stop here', False)
    """
    found = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    return (text[: min(found)], True) if found else (text, False)


def filter_logits(logits: Any, params: SamplingParams) -> Any:
    """Logits scaled by the temperature, with tokens outside top-k and top-p set to -inf."""
    import torch

    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        # a token goes when the tokens above it already cover top_p; the first one always stays
        # (a top_p below float32's resolution would otherwise drop every token)
        drop = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        drop[..., 0] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < MIN_TEMPERATURE


def pick_rows(logits: Any, requests: list[tuple[SamplingParams, Any, int]]) -> Any:
    """One token per row of `logits` (fp32 `[rows, vocab]`), whose rows are the rows of `requests`
    in order: (its params, its `torch.Generator` or None, its number of rows).

    Greedy rows take the argmax. The other rows are filtered by their own settings (rows with the
    same settings in one call), then each takes the token where its cumulative probability first
    exceeds a uniform draw from its request's own generator (inverse-CDF sampling: one draw per row,
    so a request draws the same numbers alone or among others, and the draw costs no call per row).
    """
    import torch

    picked = torch.argmax(logits, dim=-1)
    uniforms = torch.zeros(logits.shape[0], device=logits.device)
    by_settings: dict[tuple, list[int]] = {}
    start = 0
    for params, generator, count in requests:
        if not is_greedy(params):
            uniforms[start : start + count] = torch.rand(count, generator=generator, device=logits.device)
            key = (params.temperature, params.top_k, params.top_p)
            by_settings.setdefault(key, []).extend(range(start, start + count))
        start += count
    for (temperature, top_k, top_p), rows in by_settings.items():
        settings = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
        every = len(rows) == logits.shape[0]
        index = None if every else torch.tensor(rows, device=logits.device)
        chosen = logits if every else logits[index]
        cdf = torch.cumsum(torch.softmax(filter_logits(chosen, settings), dim=-1), dim=-1)
        draws = (uniforms if every else uniforms[index]) * cdf[:, -1]
        tokens = torch.searchsorted(cdf, draws[:, None], right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)
        if every:
            picked = tokens
        else:
            picked[index] = tokens
    return picked

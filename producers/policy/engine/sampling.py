"""How the engine samples: `SamplingParams`, the `Sample` it returns, and the sampling loop
(temperature, top-k, top-p, a KV cache, each token's logprob from the raw fp32 logits).

torch is imported inside the functions that need it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Below this temperature sampling is greedy decoding, its limit (vLLM's floor too): logits divided
# by 1e-300 overflow to inf and the softmax to NaN.
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: temperature scaling, then top-k, then top-p (nucleus) filtering."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_tokens: int = 64
    seed: int | None = None
    n: int = 1

    def __post_init__(self) -> None:
        checks = {
            "temperature": self.temperature >= 0,
            "top_p": 0 < self.top_p <= 1,
            "top_k": self.top_k >= 0,
            "max_tokens": self.max_tokens >= 1,
            "n": self.n >= 1,
        }
        for field, ok in checks.items():
            if not ok:
                raise ValueError(f"SamplingParams.{field}: invalid value {getattr(self, field)!r}")

    def as_dict(self) -> dict:
        """The parameters as a plain dict, for recording next to the samples."""
        return asdict(self)


@dataclass(frozen=True)
class Sample:
    """One completion: its tokens (with the final stop token when one was generated) and logprobs."""

    token_ids: list[int]
    logprobs: list[float]  # log-softmax of the raw fp32 logits at each sampled token
    finish_reason: str  # "stop" (a stop token) or "length" (max_tokens)
    text: str  # decoded without special tokens
    policy_version: str | None = None  # set by engines that learn it per call (the upstream proxy)


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


def pick_tokens(logits: Any, params: SamplingParams, generator: Any) -> Any:
    """One token per row: argmax when greedy, else a draw from the filtered distribution."""
    import torch

    if params.temperature < MIN_TEMPERATURE:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(filter_logits(logits, params), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def sample_loop(model: Any, prompt_ids: list[int], params: SamplingParams, stop: list[int]) -> list[dict]:
    """`params.n` completions of one prompt, decoded together with one KV cache.

    The prompt is run once and its cache repeated per row; a row that hits a stop token leaves
    the batch (its cache rows are dropped). Returns per row: tokens, logprobs, finish reason.
    """
    import torch

    device = next(model.parameters()).device
    rows = 1 if params.temperature < MIN_TEMPERATURE else params.n  # greedy rows would all be the same
    generator = None
    if params.seed is not None:
        generator = torch.Generator(device=device).manual_seed(params.seed)
    out = model(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True, logits_to_keep=1)
    cache, logits = out.past_key_values, out.logits[:, -1, :].float()
    if rows > 1:
        cache.batch_repeat_interleave(rows)
        logits = logits.expand(rows, -1)
    stop_tensor = torch.tensor(stop, dtype=torch.long, device=device)
    done = [{"tokens": [], "logprobs": [], "finish_reason": "length"} for _ in range(rows)]
    alive = list(range(rows))
    for step in range(params.max_tokens):
        picked = pick_tokens(logits, params, generator)
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, picked[:, None]).squeeze(-1)
        stopped = torch.isin(picked, stop_tensor)
        for row, token, logprob, ends in zip(
            alive, picked.tolist(), logprobs.tolist(), stopped.tolist(), strict=True
        ):
            done[row]["tokens"].append(token)
            done[row]["logprobs"].append(logprob)
            if ends:
                done[row]["finish_reason"] = "stop"
        if bool(stopped.all()) or step + 1 == params.max_tokens:
            break
        if bool(stopped.any()):
            keep = (~stopped).nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            alive = [alive[i] for i in keep.tolist()]
            picked = picked[keep]
        out = model(input_ids=picked[:, None], past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache, logits = out.past_key_values, out.logits[:, -1, :].float()
    return done * params.n if rows == 1 and params.n > 1 else done

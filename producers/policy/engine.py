"""The policy server's local engine: one base causal LM (transformers), optional LoRA adapters (peft),
a chat-template renderer and a sampling loop that returns each token's logprob.

What it owns: loading a base model and its tokenizer from a directory, loading adapters into it,
rendering messages (+ OpenAI `tools`) to prompt ids, sampling with a KV cache, and scoring a
completion with a fresh forward pass. The logprobs it stores are the log-softmax of the raw model
logits (fp32, temperature 1, before top-k / top-p), so the trainer can use them as behaviour-policy
logprobs whatever sampling settings produced the tokens.

What it must not do: import torch / transformers / peft at module import (they are imported inside
the functions that need them), download anything, or know about HTTP, Kafka or recording.

Engines made by `with_adapter` share the base weights: the adapters are loaded side by side into
one peft model, each engine activates its own under one lock for the length of a call (so calls
on engines of one base run one at a time), and an engine's adapter is dropped after the engine is
garbage collected.

    EngineError (ProducerError)    a base model or adapter that cannot be loaded, a bad request
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from producers.errors import ProducerError

log = logging.getLogger(__name__)

DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}
DTYPES |= {"fp32": "float32", "float32": "float32"}

# Below this temperature sampling is greedy decoding, its limit (vLLM's floor too): logits divided
# by 1e-300 overflow to inf and the softmax to NaN.
MIN_TEMPERATURE = 1e-5
# transformers' `model_max_length` when a tokenizer does not say (int(1e30)): not a limit.
_NO_LIMIT = 10**12


class EngineError(ProducerError):
    """A base model or adapter that cannot be loaded (the message names the path), or a bad request."""


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


# --- loading ---------------------------------------------------------------------------------------


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _resolve_dtype(dtype: str, device: str) -> Any:
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in DTYPES:
        raise EngineError(f"dtype: unknown value {dtype!r} (expected auto, {', '.join(DTYPES)})")
    return getattr(torch, DTYPES[dtype])


def _load_base(path: Path, device: str, dtype: Any) -> tuple[Any, Any]:
    """The model (eval mode, on `device`) and tokenizer saved in `path`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not path.is_dir():
        raise EngineError(f"base model {path}: no such directory")
    if not (path / "config.json").is_file():
        raise EngineError(f"base model {path}: no config.json")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except Exception as exc:
        raise EngineError(f"base model {path}: cannot load: {_one_line(exc)}") from exc
    if tokenizer.chat_template is None:
        raise EngineError(f"base model {path}: the tokenizer has no chat template")
    return model.to(device).eval(), tokenizer


def adapter_dir(path: str | Path) -> Path:
    """The adapter directory of `path`: a trainer checkpoint (holding `adapter/`) or an adapter itself."""
    path = Path(path)
    if (path / "adapter" / "adapter_config.json").is_file():
        return path / "adapter"
    if (path / "adapter_config.json").is_file():
        return path
    raise EngineError(f"adapter {path}: no adapter_config.json (nor adapter/adapter_config.json)")


def _read_adapter(path: Path, device: str) -> tuple[Any, dict]:
    """The adapter's config and weights, read and checked before anything touches the model."""
    from peft import PeftConfig
    from peft.utils import load_peft_weights

    try:
        config = PeftConfig.from_pretrained(path)
        weights = load_peft_weights(str(path), device=device)
    except Exception as exc:
        raise EngineError(f"adapter {path}: cannot load: {_one_line(exc)}") from exc
    config.inference_mode = True
    return config, weights


def tokenizer_hash(tokenizer: Any, base_model: Path) -> str:
    """16 hex chars of sha256 over tokenizer.json (or the vocabulary) and the chat template."""
    digest = hashlib.sha256()
    file = base_model / "tokenizer.json"
    if file.is_file():
        digest.update(file.read_bytes())
    else:
        digest.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
    template = tokenizer.chat_template
    digest.update(b"\0" + (template if isinstance(template, str) else json.dumps(template)).encode())
    return digest.hexdigest()[:16]


def find_stop_ids(tokenizer: Any, model: Any) -> list[int]:
    """Token ids that end a completion: the tokenizer's eos, the generation config's, `<|im_end|>`."""
    found = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    found |= set(configured) if isinstance(configured, list) else {configured}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if im_end is not None and im_end != tokenizer.unk_token_id:
        found.add(im_end)
    return sorted(i for i in found if isinstance(i, int) and i >= 0)


def context_length(tokenizer: Any, config: Any = None) -> int | None:
    """The longest sequence (prompt + completion) the model takes: the smaller of the model config's
    `max_position_embeddings` and the tokenizer's `model_max_length` (transformers puts 1e30 there
    when the tokenizer does not say); None when neither says."""
    limits = [getattr(config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    known = [int(n) for n in limits if isinstance(n, int | float) and 0 < n < _NO_LIMIT]
    return min(known) if known else None


def longest_token_bytes(tokenizer: Any) -> int:
    """An upper bound of the input bytes one token stands for: the longest vocabulary entry (special
    tokens included) in UTF-8. A byte-level entry spells one byte per character, a SentencePiece one
    spells `▁` (3 bytes) for a space and `<0x0A>` for one byte, so the entry's own UTF-8 length is
    never less than what it encodes."""
    return max((len(token.encode()) for token in tokenizer.get_vocab()), default=1)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


class _SharedModel:
    """One loaded base model and the adapters loaded into it side by side, one name per engine.

    `use(name)` holds the lock for a whole call with that adapter active (None: adapters off).
    Dropped adapters are only queued by `drop` (a finalizer may run in any thread, even one that
    holds the lock) and deleted at the next `use` or `add`.
    """

    def __init__(self, model: Any, device: str):
        self.model = model
        self.device = device
        self.lock = threading.Lock()
        self.tokenizer_lock = threading.Lock()  # fast tokenizers can fail when used concurrently
        self._names = itertools.count(1)
        self._dropped: list[str] = []

    def add(self, path: Path) -> str:
        """Load the adapter in `path` under a new name; on failure the model is as it was."""
        config, weights = _read_adapter(path, self.device)
        with self.lock:
            self._purge()
            name = f"adapter{next(self._names)}"
            try:
                self._inject(name, config, weights)
            except Exception as exc:
                self._remove(name)
                raise EngineError(f"adapter {path}: cannot load: {_one_line(exc)}") from exc
        return name

    def _inject(self, name: str, config: Any, weights: dict) -> None:
        from peft import PeftModel
        from peft.utils import set_peft_model_state_dict

        if isinstance(self.model, PeftModel):
            self.model.add_adapter(name, config)
        else:
            self.model = PeftModel(self.model, config, adapter_name=name)
        result = set_peft_model_state_dict(self.model, weights, adapter_name=name)
        missing = [k for k in result.missing_keys if f".{name}." in k]  # this adapter's own weights only
        if result.unexpected_keys or missing:
            raise ValueError(f"weights do not fit the base: {(result.unexpected_keys or missing)[:3]}")
        self.model.eval()

    def _remove(self, name: str) -> None:
        from peft import PeftModel

        if not isinstance(self.model, PeftModel) or name not in self.model.peft_config:
            return
        with warnings.catch_warnings():  # peft says which adapter it activates instead: we pick per call
            warnings.simplefilter("ignore", UserWarning)
            self.model.delete_adapter(name)
        if not self.model.peft_config:  # the last adapter: back to the plain base model
            self.model = self.model.unload()

    def _purge(self) -> None:
        while self._dropped:
            self._remove(self._dropped.pop())

    def drop(self, name: str) -> None:
        self._dropped.append(name)

    @contextlib.contextmanager
    def use(self, name: str | None) -> Iterator[Any]:
        from peft import PeftModel

        with self.lock:
            self._purge()
            if not isinstance(self.model, PeftModel):
                yield self.model
            elif name is None:
                with self.model.disable_adapter():
                    yield self.model
            else:
                self.model.set_adapter(name)
                yield self.model


# --- sampling --------------------------------------------------------------------------------------


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


# --- the engine ------------------------------------------------------------------------------------


class LocalEngine:
    """transformers + peft, CPU or GPU: render, sample with logprobs, score, swap adapters."""

    model_name: str
    version: str
    tokenizer: Any
    tokenizer_hash: str
    stop_ids: list[int]  # token ids that end a completion (eos, <|im_end|>)
    context_length: int | None  # prompt + completion, at most (see `context_length`)
    longest_token_bytes: int  # see `longest_token_bytes`

    def __init__(
        self,
        base_model: str | Path,
        adapter: str | Path | None = None,
        version: str = "base",
        device: str = "auto",
        dtype: str = "auto",
    ):
        started = time.monotonic()
        base = Path(base_model).expanduser().resolve()
        device = _resolve_device(device)
        model, tokenizer = _load_base(base, device, _resolve_dtype(dtype, device))
        shared = _SharedModel(model, device)
        name = shared.add(adapter_dir(adapter)) if adapter is not None else None
        self._attach(shared, name, version, tokenizer, base)
        self.tokenizer_hash = tokenizer_hash(tokenizer, base)
        self.context_length = context_length(tokenizer, model.config)
        self.longest_token_bytes = longest_token_bytes(tokenizer)
        log.info(
            "policy engine: loaded %s (%s) on %s %s in %.2fs, adapter %s",
            self.model_name, version, device, model.dtype, time.monotonic() - started, adapter,
        )  # fmt: skip

    def _attach(self, shared: _SharedModel, name: str | None, version: str, tokenizer: Any, base: Path):
        self._shared = shared
        self._adapter_name = name
        self.version = version
        self.tokenizer = tokenizer
        self.model_name = base.name
        self._base = base
        self.stop_ids = find_stop_ids(tokenizer, shared.model)
        if name is not None:
            weakref.finalize(self, shared.drop, name)

    @property
    def tokenizer_lock(self) -> threading.Lock:
        """Held around every use of the (shared) tokenizer: fast tokenizers are not thread-safe."""
        return self._shared.tokenizer_lock

    @property
    def device(self) -> str:
        return self._shared.device

    def with_adapter(self, adapter: str | Path, version: str) -> LocalEngine:
        """A new engine on the same base weights with another adapter; `self` is left as it was."""
        path = adapter_dir(adapter)
        name = self._shared.add(path)
        other = type(self).__new__(type(self))
        other._attach(self._shared, name, version, self.tokenizer, self._base)
        other.tokenizer_hash = self.tokenizer_hash
        other.context_length, other.longest_token_bytes = self.context_length, self.longest_token_bytes
        log.info("policy engine: %s now also serves %s from %s", self.model_name, version, path)
        return other

    def render(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The prompt ids of `messages` (+ `tools`) with the assistant's generation prompt."""
        with self._shared.tokenizer_lock:
            ids = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        if hasattr(ids, "keys"):  # a BatchEncoding from a tokenizer that ignores return_dict
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def decode(self, token_ids: list[int]) -> str:
        with self._shared.tokenizer_lock:
            return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Sample]:
        """`params.n` samples of a completion of `prompt_ids`; the same seed gives the same samples."""
        import torch

        if not prompt_ids:
            raise EngineError("prompt_ids: empty")
        started = time.monotonic()
        with self._shared.use(self._adapter_name) as model, torch.inference_mode():
            rows = sample_loop(model, list(prompt_ids), params, self.stop_ids)
        samples = [
            Sample(list(r["tokens"]), list(r["logprobs"]), r["finish_reason"], self.decode(r["tokens"]))
            for r in rows
        ]
        tokens = sum(len(s.token_ids) for s in samples)
        log.debug("policy engine %s: %d tokens in %.3fs", self.version, tokens, time.monotonic() - started)
        return samples

    def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """The logprob of each completion token after `prompt_ids` (raw log-softmax, one forward pass)."""
        import torch

        if not prompt_ids:
            raise EngineError("prompt_ids: empty")
        if not completion_ids:
            return []
        ids = [*prompt_ids, *completion_ids]
        with self._shared.use(self._adapter_name) as model, torch.inference_mode():
            inputs = torch.tensor([ids], device=self.device)
            logits = model(input_ids=inputs, logits_to_keep=len(completion_ids) + 1).logits[0, :-1]
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            targets = torch.tensor(completion_ids, device=self.device)[:, None]
            return logprobs.gather(-1, targets).squeeze(-1).tolist()

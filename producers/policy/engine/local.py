"""`LocalEngine`: transformers + peft on this machine: render, sample with logprobs, score, and
engines that share one base model with their own adapter (`with_adapter`). See the package docstring."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from producers.policy.engine.errors import EngineError
from producers.policy.engine.loading import adapter_dir, load_base, resolve_device, resolve_dtype
from producers.policy.engine.sampling import Sample, SamplingParams, sample_loop
from producers.policy.engine.shared_model import SharedModel
from producers.policy.engine.tokenizer import (
    context_length,
    find_stop_ids,
    longest_token_bytes,
    tokenizer_hash,
)

log = logging.getLogger(__name__)


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
        device = resolve_device(device)
        model, tokenizer = load_base(base, device, resolve_dtype(dtype, device))
        shared = SharedModel(model, device)
        name = shared.add(adapter_dir(adapter)) if adapter is not None else None
        self._attach(shared, name, version, tokenizer, base)
        self.tokenizer_hash = tokenizer_hash(tokenizer, base)
        self.context_length = context_length(tokenizer, model.config)
        self.longest_token_bytes = longest_token_bytes(tokenizer)
        log.info(
            "policy engine: loaded %s (%s) on %s %s in %.2fs, adapter %s",
            self.model_name, version, device, model.dtype, time.monotonic() - started, adapter,
        )  # fmt: skip

    def _attach(self, shared: SharedModel, name: str | None, version: str, tokenizer: Any, base: Path):
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

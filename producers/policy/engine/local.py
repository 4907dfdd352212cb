"""`LocalEngine`: transformers + peft on this machine: render, sample with logprobs (requests
decoded together by the model's scheduler, `batching`), score, and engines for newer checkpoints
(`with_checkpoint`: a LoRA adapter on the same base weights, or a full fine-tune loaded beside it).
See the package docstring."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from producers.policy.engine.errors import EngineError
from producers.policy.engine.jobs import Job, OnToken
from producers.policy.engine.loading import (
    check_fits_base,
    checkpoint_dir,
    load_base,
    resolve_device,
    resolve_dtype,
)
from producers.policy.engine.sampling import Sample, SamplingParams
from producers.policy.engine.shared_model import SharedModel
from producers.policy.engine.tokenizer import context_length, find_stop_ids, longest_token_bytes

log = logging.getLogger(__name__)


class LocalEngine:
    """transformers + peft, CPU or GPU: render, sample with logprobs, score, swap checkpoints."""

    model_name: str
    version: str
    tokenizer: Any
    base_model_id: str  # `clients.base_model.base_model_id` of the base directory
    tokenizer_hash: str  # `clients.base_model.tokenizer_hash` of the base's tokenizer
    stop_ids: list[int]  # token ids that end a completion (eos, <|im_end|>)
    context_length: int | None  # prompt + completion, at most (see `context_length`)
    longest_token_bytes: int  # see `longest_token_bytes`

    def __init__(
        self,
        base_model: str | Path,
        adapter: str | Path | None = None,  # a checkpoint to serve (see `with_checkpoint`)
        version: str = "base",
        device: str = "auto",
        dtype: str = "auto",
    ):
        from clients.base_model import base_model_id, tokenizer_hash

        started = time.monotonic()
        base = Path(base_model).expanduser().resolve()
        device = resolve_device(device)
        model, tokenizer = load_base(base, device, resolve_dtype(dtype, device))
        root = SharedModel(model, device)
        self._root = root  # the base model: adapters of every version go into it
        self.tokenizer = tokenizer
        self.model_name = base.name
        self.base_model_id = base_model_id(base)
        self.tokenizer_hash = tokenizer_hash(tokenizer, base)
        self.context_length = context_length(tokenizer, model.config)
        self.longest_token_bytes = longest_token_bytes(tokenizer)
        self._serve(root, None, version)
        if adapter is not None:  # any checkpoint, despite the name: an adapter or a full fine-tune
            kind, directory = checkpoint_dir(adapter)
            if kind == "adapter":
                self._serve(root, root.add(directory), version)
            else:
                self._serve(self._load_full(directory), None, version)
        log.info(
            "policy engine: loaded %s (%s) on %s %s in %.2fs, checkpoint %s",
            self.model_name, version, device, model.dtype, time.monotonic() - started, adapter,
        )  # fmt: skip

    def _serve(self, shared: SharedModel, adapter: str | None, version: str) -> None:
        self._shared = shared  # the model this engine samples from (the base, or a full fine-tune)
        self._adapter_name = adapter
        self.version = version
        self.stop_ids = find_stop_ids(self.tokenizer, shared.model)
        if adapter is not None:
            weakref.finalize(self, shared.drop, adapter)

    def _sibling(self, shared: SharedModel, adapter: str | None, version: str) -> LocalEngine:
        other = type(self).__new__(type(self))
        other._root, other.tokenizer, other.model_name = self._root, self.tokenizer, self.model_name
        other.base_model_id, other.tokenizer_hash = self.base_model_id, self.tokenizer_hash
        other.context_length, other.longest_token_bytes = self.context_length, self.longest_token_bytes
        other._serve(shared, adapter, version)
        return other

    @property
    def tokenizer_lock(self) -> threading.Lock:
        """Held around every use of the (shared) tokenizer: fast tokenizers are not thread-safe."""
        return self._root.tokenizer_lock

    @property
    def device(self) -> str:
        return self._root.device

    def with_checkpoint(self, path: str | Path, version: str) -> LocalEngine:
        """A new engine serving the checkpoint in `path` as `version`; `self` is left as it was.

        `path`: an executor checkpoint (`vN/` holding `adapter/` or `model/`), an adapter directory or
        a model directory. An adapter is loaded into the base model beside the others (one copy of the
        base weights); a full fine-tune is loaded as a model of its own, with its own decode loop,
        after checking that it reads and writes the base's tokens. EngineError names `path` when it
        cannot be served."""
        kind, directory = checkpoint_dir(path)
        if kind == "adapter":
            other = self._sibling(self._root, self._root.add(directory), version)
        else:
            other = self._sibling(self._load_full(directory), None, version)
        log.info(
            "policy engine: %s now also serves %s (%s) from %s", self.model_name, version, kind, directory
        )
        return other

    def _load_full(self, directory: Path) -> SharedModel:
        base_model = self._root.model
        model, tokenizer = load_base(directory, self.device, base_model.dtype, what="checkpoint")
        check_fits_base(directory, model, tokenizer, self, base_model)
        return SharedModel(model, self.device)

    def render(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The prompt ids of `messages` (+ `tools`) with the assistant's generation prompt."""
        with self.tokenizer_lock:
            ids = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        if hasattr(ids, "keys"):  # a BatchEncoding from a tokenizer that ignores return_dict
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def decode(self, token_ids: list[int]) -> str:
        with self.tokenizer_lock:
            return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def generate(
        self, prompt_ids: list[int], params: SamplingParams, on_token: OnToken | None = None
    ) -> list[Sample]:
        """`params.n` samples of a completion of `prompt_ids`; the same seed gives the same samples,
        alone or among concurrent requests. `on_token(choice_index, token_id)` is called from the
        decode thread as each token is sampled: it must return quickly and not call the engine (every
        request waits for it); an exception in it fails this request only."""
        if not prompt_ids:
            raise EngineError("prompt_ids: empty")
        started = time.monotonic()
        job = Job(
            list(prompt_ids), params, self._adapter_name, self.stop_ids, self.decode, on_token, self.device
        )
        samples = self._shared.scheduler.run(job)
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

"""The recording proxy's engine: sampling happens on an upstream OpenAI-compatible server (vLLM,
SGLang, or another `agentstream policy`), token in and token out.

The proxy renders the chat with the model's own tokenizer (a local directory: the tokenizer and
chat template only, no weights), so prompts are built token-in exactly as with the built-in
engine, then calls the upstream `/v1/completions` with `prompt` as token ids and asks for the
sampled token ids and their logprobs (`return_token_ids`, `logprobs`). What it records is
therefore the same as the built-in backend's. The policy version is the upstream's
(`x-agentstream-policy-version` header or `policy_version` field), else `upstream_version`.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from producers.policy.engine.errors import EngineError
from producers.policy.engine.sampling import Sample, SamplingParams
from producers.policy.engine.tokenizer import context_length, longest_token_bytes, tokenizer_hash

log = logging.getLogger(__name__)

VERSION_HEADER = "x-agentstream-policy-version"


class UpstreamEngine:
    """Same interface as `LocalEngine` for the service: render, decode, generate."""

    def __init__(
        self,
        upstream: str,
        tokenizer_dir: str | Path,
        model: str = "",
        upstream_version: str = "upstream",
        timeout_s: float = 300.0,
    ):
        import httpx
        from transformers import AutoTokenizer

        self.upstream = upstream.rstrip("/")
        base = Path(tokenizer_dir)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(base)
        except (OSError, ValueError) as exc:
            raise EngineError(f"tokenizer {base}: cannot load: {exc}") from None
        if not self.tokenizer.chat_template:
            raise EngineError(f"tokenizer {base}: the tokenizer has no chat template")
        self.tokenizer_hash = tokenizer_hash(self.tokenizer, base)
        self.context_length = context_length(self.tokenizer, _model_config(base))
        self.longest_token_bytes = longest_token_bytes(self.tokenizer)
        self.version = upstream_version
        self._client = httpx.Client(timeout=timeout_s)
        self.tokenizer_lock = threading.Lock()  # fast tokenizers are not thread-safe
        self.upstream_model = model or self._first_model()
        self.model_name = self.upstream_model

    def _first_model(self) -> str:
        try:
            response = self._client.get(f"{self.upstream}/models")
            response.raise_for_status()
            ids = [model["id"] for model in response.json()["data"]]
            named = [i for i in ids if i != "policy"]  # "policy" is an agentstream server's alias
            return (named or ids)[0]
        except Exception as exc:
            raise EngineError(f"upstream {self.upstream}: cannot list its models: {exc!r}") from None

    def render(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        with self.tokenizer_lock:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False
            )
            return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, token_ids: list[int]) -> str:
        with self.tokenizer_lock:
            return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Sample]:
        """`params.n` samples from the upstream, with their token ids and logprobs."""
        body = {
            "model": self.upstream_model,
            "prompt": prompt_ids,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "n": params.n,
            "logprobs": 1,
            "return_token_ids": True,  # vLLM >= 0.10.2; SGLang and agentstream policy return them too
            "skip_special_tokens": False,
        }
        if params.top_k:
            body["top_k"] = params.top_k
        if params.seed is not None:
            body["seed"] = params.seed
        response = self._client.post(f"{self.upstream}/completions", json=body)
        if response.status_code != 200:
            raise EngineError(f"upstream {self.upstream}: HTTP {response.status_code}: {response.text[:300]}")
        payload = response.json()
        version = response.headers.get(VERSION_HEADER) or payload.get("policy_version") or self.version
        return [self._sample(choice, version) for choice in payload["choices"]]

    def _sample(self, choice: dict, version: str) -> Sample:
        token_ids = choice.get("token_ids")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        if token_ids is None or logprobs is None or len(token_ids) != len(logprobs):
            raise EngineError(
                f"upstream {self.upstream}: the reply has no sampled token ids and logprobs "
                "(a vLLM >= 0.10.2 or SGLang server answers return_token_ids and logprobs)"
            )
        text = self.decode(token_ids)
        return Sample(
            list(token_ids),
            [float(x) for x in logprobs],
            choice.get("finish_reason") or "stop",
            text,
            version,
        )

    def with_adapter(self, adapter, version: str):
        raise EngineError("proxy mode: the upstream server loads new policies itself (--follow is off)")

    def close(self) -> None:
        self._client.close()


def _model_config(base: Path):
    """The model's config beside its tokenizer, when it is there (for its context length)."""
    if not (base / "config.json").is_file():
        return None
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(base)
    except (OSError, ValueError):
        return None

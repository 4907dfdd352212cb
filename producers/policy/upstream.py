"""The recording proxy's engine: sampling happens on an upstream OpenAI-compatible server (vLLM,
SGLang, or another `agentstream policy`), token in and token out.

The proxy renders the chat with the model's own tokenizer (a local directory: the tokenizer and
chat template, weights optional), so prompts are built token-in exactly as with the built-in
engine, then calls the upstream `/v1/completions` with `prompt` as token ids and asks for the
sampled token ids and their logprobs (upstream_api.py has the wire format). What it records is
therefore the same as the built-in backend's.

Versions: `with_checkpoint(path, version)` loads a LoRA checkpoint into the upstream through its
runtime adapter API (vLLM's `POST /v1/load_lora_adapter`, named by the version; started with
`--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) and returns a new engine that samples
with `model=<version>`; the engine it was called on keeps sampling its own version until the
service swaps, so a response never mixes versions; a load waits for the requests in flight and
holds new ones until it is done (`LoadGate`: vLLM's CPU build was seen applying a freshly loaded
adapter to requests mid-decode). Old versions are unloaded
(upstream_versions.py says when). A full fine-tune (`model/`) is refused: vLLM has no weight-reload
API to rely on (its CPU build least of all): `proxy_engine` refuses to start on one, a reload
refuses it and the old version serves on. A name the upstream has already is re-loaded with
`load_inplace` (vLLM keeps that name's id). The version recorded is the one asked for; on the
upstream's base model it is the upstream's own (`x-agentstream-policy-version` header or
`policy_version` field, an agentstream upstream reloads itself) or else "base".

HTTP: kept-alive HTTP/1.1 connections, one per request in flight, orjson bodies (upstream_http.py:
about a third of httpx's CPU per call, on the proxy's hot path).

Not streamed: the upstream is called for the whole completion and `on_token` gets each token once
the reply is in. Failures reach the client as OpenAI-style 502/503/504 naming the upstream
(`UpstreamError`), before anything is recorded.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from clients.base_model import base_model_id, tokenizer_hash
from producers.policy.engine.errors import EngineError, one_line
from producers.policy.engine.loading import adapter_dir
from producers.policy.engine.sampling import Sample, SamplingParams
from producers.policy.engine.tokenizer import context_length, longest_token_bytes
from producers.policy.upstream_api import (
    AGENTSTREAM_OWNER,
    POLICY_ALIAS,
    UpstreamError,
    UpstreamModels,
    api_base,
    completion_body,
    read_models,
    samples_of,
)
from producers.policy.upstream_http import UpstreamHttp
from producers.policy.upstream_versions import LoadedVersions

log = logging.getLogger(__name__)

VERSION_HEADER = "x-agentstream-policy-version"
BASE_VERSION = "base"
FULL_MODEL_REFUSED = (
    "is a full fine-tune (model/): proxy mode serves LoRA versions only, loaded through the upstream's "
    "runtime adapter API (vLLM has no weight-reload API to rely on); serve full fine-tunes with the "
    "built-in engine (agentstream policy without --upstream)"
)


class LoadGate:
    """Adapter loads wait until no request is in flight at the upstream, and requests wait while a
    load runs.

    Why: vLLM's CPU build (0.32.0) applies an adapter loaded at runtime to requests already
    decoding: a base request that was mid-decode when `l1` loaded got `l1`'s LoRA from the next
    step on (its logprobs match base for the first positions and base + `l1` after, exactly), so
    one response would mix versions. Loads are rare (one per policy version) and a drain waits at
    most for the requests in flight (each bounded by the HTTP timeout).

    >>> gate = LoadGate()
    >>> with gate.request():
    ...     gate.running
    1
    >>> with gate.load(timeout_s=1):
    ...     gate.running
    0
    """

    def __init__(self):
        self._changed = threading.Condition()
        self.running = 0
        self._loading = False

    @contextmanager
    def request(self):
        with self._changed:
            while self._loading:
                self._changed.wait()
            self.running += 1
        try:
            yield
        finally:
            with self._changed:
                self.running -= 1
                self._changed.notify_all()

    @contextmanager
    def load(self, timeout_s: float):
        """Hold new requests, wait for the ones in flight, then run the load (EngineError when they
        are not done within `timeout_s`; requests go on)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._loading:
                self._changed.wait()
            self._loading = True
            while self.running:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._loading = False
                    self._changed.notify_all()
                    raise EngineError(f"{self.running} requests still in flight after {timeout_s:.0f}s")
                self._changed.wait(left)
        try:
            yield
        finally:
            with self._changed:
                self._loading = False
                self._changed.notify_all()


class _Upstream:
    """What the engines of one proxy share: the HTTP client, the loaded versions, the tokenizer's
    lock, and the gate that keeps loads apart from requests."""

    def __init__(self, api: str, client: UpstreamHttp, versions: LoadedVersions, timeout_s: float):
        self.api, self.client, self.versions = api, client, versions
        self.tokenizer_lock = threading.Lock()  # fast tokenizers are not thread-safe
        self.gate = LoadGate()
        self.drain_timeout_s = timeout_s + 10

    def post(self, path: str, body: dict, timeout_s: float | None = None):
        """POST to the upstream; a transport failure is an `UpstreamError` naming the upstream."""
        return self.client.post(path, body, timeout_s)

    def unload(self, names: list[str]) -> None:
        for name in names:
            try:
                response = self.post("/unload_lora_adapter", {"lora_name": name}, timeout_s=60)
                ok = response.is_success
                detail = f"HTTP {response.status_code}: {response.text[:200]}"
            except UpstreamError as exc:
                ok, detail = False, exc.message
            if ok:
                log.info("policy proxy: unloaded %s from %s", name, self.api)
            else:
                log.warning("policy proxy: could not unload %s from %s (%s)", name, self.api, detail)


class UpstreamEngine:
    """Same interface as `LocalEngine` for the service: render, decode, generate, with_checkpoint."""

    def __init__(
        self,
        upstream: str,
        tokenizer_dir: str | Path,
        keep_versions: int = 2,
        timeout_s: float = 300.0,
    ):
        from transformers import AutoTokenizer

        api = api_base(upstream)
        base = Path(tokenizer_dir)
        try:
            tokenizer = AutoTokenizer.from_pretrained(base)
        except (OSError, ValueError) as exc:
            raise EngineError(f"tokenizer {base}: cannot load: {one_line(exc)}") from None
        if not tokenizer.chat_template:
            raise EngineError(f"tokenizer {base}: the tokenizer has no chat template")
        client = UpstreamHttp(api, timeout_s)
        models = _list_models(client, api)
        self._shared = _Upstream(api, client, LoadedVersions(keep_versions, models.adapters), timeout_s)
        self._neutral = models.owned_by != AGENTSTREAM_OWNER
        self.upstream = api
        self.tokenizer = tokenizer
        self.tokenizer_hash = tokenizer_hash(tokenizer, base)
        self.base_model_id = base_model_id(base)  # "" for a tokenizer-only directory
        known = [n for n in (context_length(tokenizer, _model_config(base)), models.max_model_len) if n]
        self.context_length = min(known) if known else None
        self.longest_token_bytes = longest_token_bytes(tokenizer)
        self.upstream_model = self.model_name = models.base
        self.version = BASE_VERSION
        self._model = models.base  # what `model` each request names: the base, or a loaded version
        log.info(
            "policy proxy: sampling %s at %s (adapters there: %s)", models.base, api, list(models.adapters)
        )

    @property
    def tokenizer_lock(self) -> threading.Lock:
        return self._shared.tokenizer_lock

    def render(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        with self._shared.tokenizer_lock:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False
            )
            return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, token_ids: list[int]) -> str:
        with self._shared.tokenizer_lock:
            return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def generate(self, prompt_ids: list[int], params: SamplingParams, on_token=None) -> list[Sample]:
        """`params.n` samples from the upstream, with their token ids and logprobs. `on_token` is
        called for each token once the whole reply is in (the upstream is not streamed)."""
        if not prompt_ids:
            raise EngineError("prompt_ids: empty")
        with self._in_use(), self._shared.gate.request():
            response = self._shared.post(
                "/completions", completion_body(self._model, prompt_ids, params, self._neutral)
            )
        api = self._shared.api
        if not response.is_success:
            raise UpstreamError(502, f"upstream {api}: HTTP {response.status_code}: {response.text[:300]}")
        try:
            payload = response.json()
        except ValueError:
            raise UpstreamError(
                502, f"upstream {api}: the reply is not JSON: {response.text[:100]!r}"
            ) from None
        samples = samples_of(payload, params, self.decode, self._version_of(response, payload), api)
        if on_token is not None:
            for index, sample in enumerate(samples):
                for token in sample.token_ids:
                    on_token(index, token)
        return samples

    @contextmanager
    def _in_use(self):
        if self._model == self.upstream_model:
            yield
            return
        versions = self._shared.versions
        if not versions.enter(self._model):  # a request that took this engine before two swaps
            message = f"{self.version} was unloaded (newer versions serve); retry"
            raise UpstreamError(503, f"upstream {self._shared.api}: {message}")
        try:
            yield
        finally:
            self._shared.unload(versions.leave(self._model))

    def _version_of(self, response, payload) -> str:
        if self._model != self.upstream_model:
            return self.version
        reported = response.headers.get(VERSION_HEADER) or (
            payload.get("policy_version") if isinstance(payload, dict) else None
        )
        return str(reported)[:200] if reported else BASE_VERSION

    def with_checkpoint(self, path: str | Path, version: str) -> UpstreamEngine:
        """A new engine sampling `version`, the LoRA adapter of checkpoint `path` loaded into the
        upstream under that name; `self` is left as it was. EngineError naming the version and the
        upstream's answer when it refuses, and for a full fine-tune."""
        adapter = proxy_adapter(path, version)
        if version in (BASE_VERSION, self.upstream_model, POLICY_ALIAS):
            raise EngineError(f"{version}: a version cannot be named like the upstream's base model")
        versions = self._shared.versions
        body = {"lora_name": version, "lora_path": str(adapter.resolve())}
        if versions.loaded(version):
            body["load_inplace"] = True
        try:
            with self._shared.gate.load(self._shared.drain_timeout_s):  # see LoadGate
                response = self._shared.post("/load_lora_adapter", body, timeout_s=120)
        except EngineError as exc:
            raise EngineError(f"upstream {self._shared.api}: {version} not loaded: {exc}") from None
        if not response.is_success:
            raise EngineError(
                f"upstream {self._shared.api} refused to load {version} from {adapter}: "
                f"HTTP {response.status_code}: {' '.join(response.text.split())[:300]}"
            )
        other = self._view(version)
        self._shared.unload(versions.added(version, serving=self._model))
        log.info("policy proxy: %s loaded into %s from %s", version, self._shared.api, adapter)
        return other

    def _view(self, version: str) -> UpstreamEngine:
        other = type(self).__new__(type(self))
        other.__dict__.update(self.__dict__)  # the shared client, tokenizer and what was read at start
        other.version = other._model = version
        return other

    def close(self) -> None:
        self._shared.client.close()


def proxy_adapter(path: str | Path, version: str) -> Path:
    """The adapter directory of checkpoint `path`; EngineError for a full fine-tune or no adapter."""
    path = Path(path)
    try:
        return adapter_dir(path)
    except EngineError:
        if is_full_model(path):
            raise EngineError(f"checkpoint {path} ({version}) {FULL_MODEL_REFUSED}") from None
        raise


def is_full_model(path: Path) -> bool:
    """Whether checkpoint `path` is a full fine-tune (`vN/model/` or a model directory), not LoRA."""
    lora = (path / "adapter_config.json").is_file() or (path / "adapter" / "adapter_config.json").is_file()
    return not lora and ((path / "model" / "config.json").is_file() or (path / "config.json").is_file())


def proxy_engine(config, tokenizer_dir: Path, adapter: tuple[Path, str] | None, root: Path) -> UpstreamEngine:
    """The proxy's engine at start (`config` a PolicyConfig): serving `adapter` (path, version) when
    the operator named one (an error naming it when it cannot be served), else the newest valid LoRA
    checkpoint under `root` as the built-in engine picks it (start_version.py). When the version to
    serve is a full fine-tune it refuses to start, before the upstream is contacted."""
    from producers.policy.start_version import serve_newest, start_candidates

    start = adapter[0] if adapter else next((c.path for c in start_candidates(root)[0]), None)
    if start is not None and is_full_model(start):
        raise EngineError(f"checkpoint {start} {FULL_MODEL_REFUSED}")
    engine = UpstreamEngine(config.upstream, tokenizer_dir, config.upstream_keep_versions)
    if adapter:
        return engine.with_checkpoint(*adapter)
    return serve_newest(engine, root)


def _list_models(client, api: str) -> UpstreamModels:
    try:
        response = client.get("/models")
        if not response.is_success:
            raise EngineError(f"HTTP {response.status_code}: {response.text[:200]}")
        payload = response.json()
    except Exception as exc:
        raise EngineError(f"--upstream {api}: cannot list its models: {one_line(exc)}") from None
    return read_models(payload, api)


def _model_config(base: Path):
    """The model's config beside its tokenizer, when it is there (for its context length)."""
    if not (base / "config.json").is_file():
        return None
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(base)
    except (OSError, ValueError):
        return None

"""A real vLLM (the CPU build, `make vllm` installs it in `.venv-vllm`) for the tests: a pytest plugin,
loaded by `tests/conftest.py`.

Use it in a test module:

    def test_something(vllm_server):          # module-scoped: one vLLM per test module
        vllm_server.api                       # "http://127.0.0.1:PORT/v1" (`--upstream` for the proxy)
        vllm_server.model_dir                 # the tiny model it serves (also the proxy's --base-model)
        vllm_server.model                     # the name vLLM serves the base model under
        vllm_server.load_adapter("v1", make_lora_checkpoint(vllm_server, tmp_path, "v1"))
        vllm_server.pid, vllm_server.proc     # the API server's process (its own process group)

`start_vllm(root, model_dir)` is the same as a context manager, for a test that needs a vLLM of its
own (one it kills, say). `build_vllm_model(root)` builds the model: the project's tiny Qwen2 with
hidden 128 and 4 heads, because vLLM's CPU attention needs a head size of at least 32.
`make_lora_checkpoint` lays a LoRA checkpoint out as the executor does (`<root>/<version>/adapter`).

Every test that uses `vllm_server` is marked `engine`: where vLLM is not installed it skips with the
reason (`make vllm` writes it), and with AGENTSTREAM_REQUIRE_ENGINES=1 (CI) that skip is a failure.
vLLM runs in float32, eager, LoRA on (rank up to 16), one core for its model worker (its default);
its log is `<root>/vllm.log`, shown when it fails to start and when a test that uses it fails. It is
stopped by PID (its process group, SIGTERM then SIGKILL), and any process it left behind is killed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.bench.policy.reload import make_checkpoint
from tests.support.processes import REPO, Proc, descendants, free_port, hard_kill, pid_gone, wait_for
from tests.support.sandbox_engine import MARKER, REQUIRE_ENV, engines_required

VLLM_VENV = REPO / ".venv-vllm"
START_TIMEOUT_S = 300.0  # 26-49 s on an idle 2-core machine; several test processes may share it
MODEL_SHAPE = {"hidden_size": 128, "heads": 4, "kv_heads": 2}  # head size 32: vLLM's CPU minimum


@dataclass
class VllmServer:
    """A running vLLM OpenAI server."""

    url: str  # http://127.0.0.1:PORT (no /v1)
    model_dir: Path  # the base model it serves (weights, tokenizer, chat template)
    model: str  # the base model's name in vLLM's API (`model` of a request)
    proc: Proc
    root: Path  # its working directory: log, cache

    @property
    def api(self) -> str:
        """The OpenAI base URL, `.../v1`."""
        return f"{self.url}/v1"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def log_path(self) -> Path:
        return self.proc.log_path

    def log_tail(self, chars: int = 4000) -> str:
        return self.proc.log_text()[-chars:]

    def load_adapter(self, name: str, checkpoint: Path, inplace: bool = False) -> None:
        """Load a LoRA adapter under `name` (`POST /v1/load_lora_adapter`); `checkpoint` is an adapter dir
        or an executor checkpoint `<version>/` holding `adapter/`. Raises AssertionError with vLLM's
        answer when it refuses."""
        path = checkpoint / "adapter" if (checkpoint / "adapter").is_dir() else checkpoint
        body = {"lora_name": name, "lora_path": str(path), **({"load_inplace": True} if inplace else {})}
        status, text = self.post("/v1/load_lora_adapter", body)
        assert status == 200, f"vLLM refused adapter {name!r} at {path}: HTTP {status}: {text[:500]}"

    def post(self, path: str, body: dict, timeout_s: float = 120.0) -> tuple[int, str]:
        """POST JSON to `url + path`; (status, body text)."""
        import httpx

        response = httpx.post(f"{self.url}{path}", json=body, timeout=timeout_s)
        return response.status_code, response.text

    def models(self) -> list[str]:
        """The ids `GET /v1/models` lists (the base and every loaded adapter)."""
        import httpx

        response = httpx.get(f"{self.api}/models", timeout=10)
        response.raise_for_status()
        return [m["id"] for m in response.json()["data"]]


def vllm_python() -> Path:
    """`.venv-vllm/bin/python`, or skip (a failure under AGENTSTREAM_REQUIRE_ENGINES=1) saying why not."""
    python = VLLM_VENV / "bin" / "python"
    if (VLLM_VENV / ".installed").exists() and python.exists():
        return python
    unavailable = VLLM_VENV / "UNAVAILABLE"
    reason = unavailable.read_text().strip() if unavailable.exists() else "not installed: run `make vllm`"
    if engines_required():
        pytest.fail(f"{REQUIRE_ENV}=1 and vLLM cannot be had: {reason}", pytrace=False)
    pytest.skip(f"vLLM: {reason}")


def build_vllm_model(root: Path) -> Path:
    """The tiny model with a head size vLLM accepts, built (once) under `root/models/tiny`."""
    from consumers.tiny_model import tiny_model_dir

    return tiny_model_dir(root, **MODEL_SHAPE)


def make_lora_checkpoint(server: VllmServer, root: Path, version: str, seed: int = 1) -> Path:
    """A non-zero LoRA checkpoint for the served model at `<root>/<version>/adapter` (rank 4, q/v);
    returns `<root>/<version>`, as the executor lays it out."""
    return make_checkpoint(server.model_dir, root, version, seed=seed)


@contextmanager
def start_vllm(root: Path, model_dir: Path, *extra_args: str) -> Iterator[VllmServer]:
    """Start vLLM serving `model_dir` on a free port and wait until it lists its models; stop it after."""
    python = vllm_python()
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    args = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "1024",
            "--enforce-eager", "--enable-lora", "--max-lora-rank", "16", *extra_args]  # fmt: skip
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": str(root / "cache"),  # else it writes under the home directory
        "PYTHONPATH": "",  # the project's path must not leak into vLLM's venv
    }
    # cwd: not the repository, whose top-level packages would shadow the venv's for `python -m`
    proc = Proc(args, root / "vllm.log", env=env, cwd=root)
    server = VllmServer(f"http://127.0.0.1:{port}", model_dir, "", proc, root)
    try:
        server.model = _wait_ready(server)
        yield server
    finally:
        stop_vllm(server)


def _wait_ready(server: VllmServer) -> str:
    started = time.monotonic()

    def listing():
        if not server.proc.alive():
            raise RuntimeError(
                f"vLLM exited with {server.proc.popen.returncode} during start; {server.log_path}:\n"
                f"{server.log_tail()}"
            )
        try:
            return server.models()
        except Exception:
            return None

    try:
        models = wait_for(listing, timeout_s=START_TIMEOUT_S, interval_s=0.5, what="vLLM to list its models")
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; {server.log_path}:\n{server.log_tail()}") from None
    server.root.joinpath("started_s").write_text(f"{time.monotonic() - started:.1f}\n")
    return models[0]


def stop_vllm(server: VllmServer, grace_s: float = 20.0) -> None:
    """SIGTERM its process group, SIGKILL after `grace_s`; then kill whatever it left behind."""
    left = descendants(server.pid)
    server.proc.stop(grace_s=grace_s)
    try:
        wait_for(lambda: all(pid_gone(p) for p in left), timeout_s=10, what="vLLM's workers to exit")
    except TimeoutError:
        hard_kill([p for p in left if not pid_gone(p)])


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory) -> Iterator[VllmServer]:
    """One vLLM for the test module, serving the tiny model (see the module docstring)."""
    vllm_python()  # skip before building a model when vLLM is not installed
    root = tmp_path_factory.mktemp("vllm")
    with start_vllm(root, build_vllm_model(root)) as server:
        yield server


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "vllm_server" in getattr(item, "fixturenames", ()) and item.get_closest_marker(MARKER) is None:
            item.add_marker(MARKER)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used `vllm_server` shows the end of vLLM's log."""
    outcome = yield
    report = outcome.get_result()
    server = getattr(item, "funcargs", {}).get("vllm_server")
    if report.failed and isinstance(server, VllmServer):
        report.sections.append((f"vLLM log ({server.log_path}), last lines", server.log_tail()))

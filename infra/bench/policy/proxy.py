"""`agentstream bench policy --proxy-vllm`: the recording proxy (`agentstream policy --upstream`) in
front of a real vLLM, against the same vLLM called directly, in the same run: tokens/s per
concurrency and the p50 latency the proxy adds (targets: under 5 % fewer tokens/s, under 2 ms).

Like with like: both paths are driven by the same aiohttp client in this process (one session, its
connections kept alive), with the same prompts and seeds, so the same tokens on both paths (the
summary says whether the token counts matched). The proxy client posts the chat to the proxy, which
renders it with the model's template, calls vLLM's `/v1/completions` with the token ids (logprobs,
sampled ids) and records the step; the direct client posts the same token ids (rendered by the
proxy's engine code), with the same body, to vLLM. Repeats alternate direct and proxy, so drift
hits both.

The proxy runs as in production: `agentstream policy --upstream` as its own process (its default
generation threads, recording on, publishing to the bench's broker). Its CPU per call is read from
/proc (all its threads, nanoseconds), from the start of a run until its recorder has delivered
(its CPU stops rising); vLLM's own CPU is not counted.

vLLM (installed by `make vllm` in `.venv-vllm`) runs as a child, stopped by its PID (its process
group, SIGKILL after a grace period): eager, float32, the tiny model with head size 32, as the tests
run it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.bench.policy.client_load import PROMPTS, chat_body
from infra.bench.policy.table import table_row
from infra.bench.report import median, percentile
from infra.options.env import add_option
from infra.runtime import agentstream_argv, python_module_argv, stop_child

log = logging.getLogger(__name__)

TARGET_LOSS_PCT = 5.0
TARGET_ADDED_MS = 2.0
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
VLLM_SHAPE = {"hidden_size": 128, "heads": 4, "kv_heads": 2}  # head size 32: vLLM's CPU minimum
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "PYTHONPATH": "",
}
START_TIMEOUT_S = 600.0


def add_arguments(parser) -> None:
    add_option(
        parser, "--proxy-vllm", action="store_true", default=False,
        help="also compare the recording proxy in front of vLLM with vLLM alone (needs `make vllm`)",
    )  # fmt: skip
    add_option(
        parser, "--vllm-python", default=".venv-vllm/bin/python", help="--proxy-vllm: vLLM's interpreter"
    )


def proxy_comparison(args, root: Path, bootstrap: str, levels: list[int]) -> dict:
    """The `--proxy-vllm` rows and summary, or why there are none."""
    if not args.proxy_vllm:
        return {"skipped": "proxy comparison not requested (--proxy-vllm)"}
    python = Path(args.vllm_python).absolute()  # not resolve(): a venv interpreter is a symlink
    if not python.exists():
        reason = f"proxy comparison skipped: no vLLM interpreter at {python} (run `make vllm`)"
        log.warning(reason)
        return {"skipped": reason}
    from consumers.tiny_model import tiny_model_dir

    model_dir = tiny_model_dir(root / "vllm-data", **VLLM_SHAPE)
    with (
        vllm_child(python, model_dir, root / "vllm") as url,
        proxy_child(url, model_dir, root / "proxy", bootstrap) as (proxy_url, proxy_pid),
    ):
        runs = _measure(url, proxy_url, proxy_pid, model_dir, levels, args)
    return _report(runs, levels, args)


@contextmanager
def proxy_child(vllm_url: str, model_dir: Path, root: Path, bootstrap: str) -> Iterator[tuple[str, int]]:
    """`agentstream policy --upstream` on a free 127.0.0.1 port as its own process, recording to
    `bootstrap`, until the block ends (SIGTERM: it flushes its recorder); yields its URL and PID."""
    root.mkdir(parents=True, exist_ok=True)
    ready = root / "ready"
    argv = agentstream_argv(
        "policy", "--upstream", vllm_url, "--base-model", str(model_dir), "--bootstrap-servers", bootstrap,
        "--data-dir", str(root / "data"), "--port", "0", "--ready-file", str(ready), "--no-follow",
    )  # fmt: skip
    log_path = root / "proxy.log"
    with open(log_path, "ab") as out:
        child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        started = time.monotonic()
        while not (ready.exists() and ready.read_text().strip()):
            if child.poll() is not None or time.monotonic() - started > START_TIMEOUT_S:
                raise RuntimeError(f"the proxy did not start; its log {log_path}:\n{_tail(log_path)}")
            time.sleep(0.2)
        yield f"http://{ready.read_text().strip()}", child.pid
    finally:
        stop_child(child, grace_s=40)


def process_cpu_s(pid: int) -> float:
    """CPU seconds used by the threads of process `pid` (/proc/PID/task/*/schedstat, nanoseconds)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that just ended
            pass
    return total / 1e9


def _settled_cpu_s(pid: int, quiet_s: float = 0.3, limit_s: float = 10.0) -> float:
    """The proxy's CPU once it stops rising (its recorder has delivered the run's steps)."""
    deadline = time.monotonic() + limit_s
    last = process_cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = process_cpu_s(pid)
        if now - last < 0.0005:
            return now
        last = now
    return last


def _measure(vllm_url: str, proxy_url: str, proxy_pid: int, model_dir: Path, levels: list[int], args) -> dict:
    """The warm-up, then per level and repeat a direct run and a proxy run, interleaved."""
    from producers.policy.engine.sampling import SamplingParams
    from producers.policy.upstream import UpstreamEngine
    from producers.policy.upstream_api import completion_body

    renderer = UpstreamEngine(vllm_url, model_dir)  # the proxy's own rendering, in this process
    model = renderer.upstream_model
    prompts = [renderer.render(messages) for messages in PROMPTS]
    renderer.close()

    def direct_body(number: int) -> dict:  # what the proxy sends upstream for chat_body(number)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=number)
        return completion_body(model, prompts[number % len(prompts)], params)

    direct = (f"{vllm_url}/v1/completions", direct_body)
    proxied = (
        f"{proxy_url}/v1/episodes/{{episode}}/chat/completions",
        lambda n: chat_body(n, args.max_tokens),
    )
    warm = max(levels)  # vLLM's first requests are slow (about 20 s here): not measured
    asyncio.run(_drive(*direct, warm, warm))
    asyncio.run(_drive(*proxied, warm, warm))
    _settled_cpu_s(proxy_pid)
    runs: dict[tuple[int, str], list[dict]] = {}
    for level in levels:
        for repeat in range(max(1, args.repeats)):
            for path, (url, body) in (("direct", direct), ("proxy", proxied)):
                cpu, proxy_cpu = time.process_time(), process_cpu_s(proxy_pid)
                run = asyncio.run(_drive(url, body, args.requests, level))
                run["client_cpu_ms"] = (time.process_time() - cpu) / args.requests * 1000
                if path == "proxy":
                    run["cpu_ms"] = (_settled_cpu_s(proxy_pid) - proxy_cpu) / args.requests * 1000
                runs.setdefault((level, path), []).append(run)
            log.info("bench policy: proxy-vllm concurrency %d repeat %d done", level, repeat + 1)
    return runs


async def _drive(url: str, body, requests: int, concurrency: int) -> dict:
    """`requests` POSTs (`body(number)`) with `concurrency` in flight; each proxy call a new episode."""
    import aiohttp

    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    todo = list(range(requests))[::-1]
    latencies: list[float] = []
    tokens = 0

    async def client(session) -> None:
        nonlocal tokens
        while todo:
            number = todo.pop()
            started = time.perf_counter()
            async with session.post(
                url.format(episode=f"proxy-{tag}-{number}"), json=body(number)
            ) as response:
                answer = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"{url} answered {response.status}: {str(answer)[:300]}")
            latencies.append(time.perf_counter() - started)
            tokens += answer["usage"]["completion_tokens"]

    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "latencies": latencies, "tokens": tokens, "requests": requests}


def _report(runs: dict, levels: list[int], args) -> dict:
    rows, summary = [], {}
    for level in levels:
        for path in ("direct", "proxy"):
            cpu = median([r["cpu_ms"] for r in runs[(level, path)]]) if path == "proxy" else None
            tps = median([r["tokens"] / r["seconds"] for r in runs[(level, path)]])
            pooled = [x * 1000 for r in runs[(level, path)] for x in r["latencies"]]
            rows.append(table_row(
                "vllm direct" if path == "direct" else "proxy -> vllm", concurrency=level,
                recording="on" if path == "proxy" else "-", requests=args.requests, tokens_per_s=tps,
                requests_per_s=median([r["requests"] / r["seconds"] for r in runs[(level, path)]]),
                p50_ms=percentile(pooled, 50), p99_ms=percentile(pooled, 99), max_ms=max(pooled),
                cpu_ms_per_call=cpu,
            ))  # fmt: skip
        summary[level] = _overhead(runs[(level, "direct")], runs[(level, "proxy")])
        direct, proxy, added = rows[-2], rows[-1], summary[level]
        added["cpu_ms_added"] = proxy["cpu_ms_per_call"]  # the proxy process's CPU: all of it is added
        rows.append(table_row(
            "proxy overhead", concurrency=level, recording="on-off", p50_ms=added["p50_added_ms"],
            cpu_ms_per_call=added["cpu_ms_added"],
            tokens_per_s=proxy["tokens_per_s"] - direct["tokens_per_s"],
        ))  # fmt: skip
    return {"rows": rows, "by_concurrency": summary, "notes": _notes(summary, args)}


def _overhead(direct: list[dict], proxy: list[dict]) -> dict:
    """Paired within each repeat: tokens/s lost (%) and p50 latency added (ms); medians of the pairs."""
    pairs = list(zip(direct, proxy, strict=True))
    loss = [100 * (1 - (p["tokens"] / p["seconds"]) / (d["tokens"] / d["seconds"])) for d, p in pairs]
    added = [(percentile(p["latencies"], 50) - percentile(d["latencies"], 50)) * 1000 for d, p in pairs]
    out = {"tokens_per_s_loss_pct": median(loss), "p50_added_ms": median(added)}
    out["same_tokens"] = all(d["tokens"] == p["tokens"] for d, p in pairs)  # same samples both paths
    out["client_cpu_ms_per_call"] = {
        "direct": median([d["client_cpu_ms"] for d in direct]),
        "proxy": median([p["client_cpu_ms"] for p in proxy]),
    }
    out["target_met"] = (
        out["tokens_per_s_loss_pct"] < TARGET_LOSS_PCT and out["p50_added_ms"] < TARGET_ADDED_MS
    )
    return out | {"per_repeat": {"tokens_per_s_loss_pct": loss, "p50_added_ms": added}}


def _notes(summary: dict, args) -> list[str]:
    notes = [
        f"proxy -> vLLM (CPU build, eager, float32, tiny model, no LoRA, {args.max_tokens} max_tokens, "
        "temperature 1): "
        "same client, prompts and seeds on both paths; the proxy, its own process with its default "
        "generation threads, records every step to the broker",
        "proxy overhead rows: proxy - direct tokens/s, p50 latency added (median of the pairs of each "
        "repeat) and the proxy process's CPU per call (/proc, all threads, until its recorder has "
        "delivered; vLLM's own CPU not counted) "
        f"(targets: under {TARGET_LOSS_PCT:g} % of tokens/s lost, under {TARGET_ADDED_MS:g} ms added)",
    ]
    for level, o in summary.items():
        verdict = "met" if o["target_met"] else "NOT met"
        notes.append(
            f"proxy overhead at concurrency {level}: {o['tokens_per_s_loss_pct']:.2f} % of tokens/s lost, "
            f"{o['p50_added_ms']:+.3f} ms p50 latency added, {o['cpu_ms_added']:.3f} ms proxy CPU per call, "
            f"same tokens on both paths: {o['same_tokens']}: {verdict}"
        )
    return notes


@contextmanager
def vllm_child(python: Path, model_dir: Path, root: Path) -> Iterator[str]:
    """vLLM serving `model_dir` on a free 127.0.0.1 port until the block ends; yields its base URL."""
    root.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    args = ["--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--max-model-len", "1024", "--enforce-eager"]  # fmt: skip
    argv = [str(python), *python_module_argv(VLLM_MODULE, *args)[1:]]  # vLLM's own interpreter
    env = {**os.environ, **VLLM_ENV, "VLLM_CACHE_ROOT": str(root / "cache")}
    log_path = root / "vllm.log"
    with open(log_path, "ab") as out:
        child = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True
        )
    try:
        _wait_ready(child, f"http://127.0.0.1:{port}", log_path)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop_group(child)


def _wait_ready(child: subprocess.Popen, url: str, log_path: Path) -> None:
    import httpx

    started = time.monotonic()
    while time.monotonic() - started < START_TIMEOUT_S:
        if child.poll() is not None:
            raise RuntimeError(f"vLLM exited with {child.returncode}; its log {log_path}:\n{_tail(log_path)}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                log.info("bench policy: vLLM ready in %.0f s", time.monotonic() - started)
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(
        f"vLLM not ready after {START_TIMEOUT_S:.0f} s; its log {log_path}:\n{_tail(log_path)}"
    )


def _stop_group(child: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM vLLM's process group (its engine core is a child of the API server), then SIGKILL
    whatever of the group is left after `grace_s`."""
    deadline = time.monotonic() + grace_s
    _signal_group(child.pid, signal.SIGTERM)
    while time.monotonic() < deadline and (child.poll() is None or _signal_group(child.pid, 0)):
        time.sleep(0.2)
    _signal_group(child.pid, signal.SIGKILL)
    child.wait(timeout=10)


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the process group; False when the group has no process left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

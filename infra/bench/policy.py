"""`agentstream bench policy`: the policy server's tokens/s and requests/s at several concurrencies,
what recording each completion costs, and the pause a hot reload causes.

Setup: the tiny model on CPU; one `LocalEngine` shared by two `PolicyService`s, one recording
each completion through an `AgentRecorder` (as `runner.build_service` does) into an embedded broker
(a child process stopped by PID), the other not. Each is served by the real aiohttp app on
127.0.0.1:0 in a background event loop of this process, so `time.process_time()` covers client,
server, engine and recorder. An aiohttp client sends `--requests` chat completions per level
(`--concurrency` in flight) to one server then the other (order alternating per repeat), the same
bodies to both (temperature 1, seed = request number), each on a new episode so that it is recorded.

- serve rows: tokens/s and requests/s (medians over repeats), latency p50/p99/max (pooled), CPU
  ms of this process per call (recording: up to the broker's acknowledgement; flushed first).
- overhead rows: recording on - off, paired per repeat; target < 2 ms per call at the lowest
  concurrency. "recording only" times `step_event` + `recorder.publish` alone, burst and paced.
- reload rows: while clients run, `PolicyReloader.apply(PolicyUpdated)` switches between LoRA
  checkpoints: load and pause as the reloader records them, and the gap a client saw between its
  responses across a switch (beside the gap within one version).
- `--gpu`: `LocalEngine.generate` vs `model.generate` on a Qwen2-0.5B-shaped model built from a
  config, same prompts, when CUDA is available; otherwise one line saying why not.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path

from infra.bench.children import scratch_broker
from infra.bench.report import median, percentile
from infra.options.env import add_option

log = logging.getLogger(__name__)

TARGET_OVERHEAD_MS = 2.0
MODES = ("off", "on")  # recording
QWEN2_05B_SHAPE = {"hidden_size": 896, "layers": 24, "heads": 14, "kv_heads": 2, "intermediate_size": 4864}
COLUMNS = ("case", "concurrency", "recording", "requests", "tokens_per_s", "requests_per_s")
COLUMNS += ("p50_ms", "p99_ms", "max_ms", "cpu_ms_per_call")
PROMPTS = [
    [{"role": "system", "content": "You are an agent. Call one tool per turn."},
     {"role": "user", "content": "List the files, then read main.py."}],
    [{"role": "user", "content": "The tests fail with an AssertionError in add(). Fix the bug."}],
    [{"role": "system", "content": "You are a careful coding agent."},
     {"role": "user", "content": "Run the tests and say which one failed and why."}],
]  # fmt: skip


def add_arguments(parser) -> None:
    add_option(parser, "--concurrency", default="1,8,32", help="comma-separated requests in flight")
    add_option(parser, "--requests", type=int, default=96, help="requests per level, server and repeat")
    add_option(parser, "--max-tokens", type=int, default=32, help="max_tokens of every request")
    add_option(parser, "--workers", type=int, default=1, help="server generation threads (PolicyConfig)")
    add_option(parser, "--reloads", type=int, default=6, help="policy switches per repeat while clients run")
    add_option(parser, "--reload-interval", type=float, default=0.5, help="seconds between switches")
    add_option(parser, "--reload-concurrency", type=int, default=8, help="clients in flight during reloads")
    add_option(parser, "--checkpoints", type=int, default=3, help="LoRA checkpoints the reloads cycle over")
    add_option(
        parser, "--gpu", action="store_true", default=False,
        help="also compare LocalEngine.generate with model.generate on a 0.5B-shaped model (needs CUDA)",
    )  # fmt: skip


def run(args) -> dict:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    levels = [int(x) for x in str(args.concurrency).split(",") if x.strip()]
    with scratch_broker("policy") as (root, broker):
        result = _measure(root, broker.address, levels, args)
        result["gpu"] = gpu_comparison(args, root)
    result["rows"] += result["gpu"].get("rows", [])
    result["notes"] += result["gpu"].get("notes", [result["gpu"].get("skipped", "")])
    return result


def _measure(root: Path, bootstrap: str, levels: list[int], args) -> dict:
    from consumers.tiny_model import tiny_model_dir
    from producers.policy.engine import LocalEngine
    from producers.policy.service import PolicyService
    from producers.sdk.recorder import AgentRecorder

    base = tiny_model_dir(root / "data")
    engine = LocalEngine(base, device="cpu")
    recorder = AgentRecorder(bootstrap, root / "spool", agent="policy-server", model=engine.model_name)
    services = {"off": PolicyService(engine, None), "on": PolicyService(engine, recorder)}
    try:
        with _servers(services, args.workers) as urls:
            runs = _serve_phase(urls, recorder, levels, args)
            rate = median([r["requests"] / r["seconds"] for r in runs[(min(levels), "on")]])
            record_only = [
                _record_only(services["on"], args.requests, args.max_tokens, x) for x in (None, rate)
            ]
            reloader, reload_runs = _reload_phase(urls["on"], services["on"], base, root, bootstrap, args)
    finally:
        recorder.close(timeout=30)
    overhead = _overhead_rows(runs, levels)
    rows = [*_serve_rows(runs), *overhead, *record_only]
    reload = _reload_summary(reloader, reload_runs)
    rows += reload.pop("rows")
    per_repeat = {row["concurrency"]: row.pop("per_repeat") for row in overhead}
    lowest = overhead[0]
    summary = {
        "concurrency": lowest["concurrency"], "latency_p50_ms": lowest["p50_ms"],
        "cpu_ms_per_call": lowest["cpu_ms_per_call"], "target_ms": TARGET_OVERHEAD_MS,
        "recording_alone_paced_cpu_ms": record_only[1]["cpu_ms_per_call"],
        "target_met": max(lowest["p50_ms"], lowest["cpu_ms_per_call"]) < TARGET_OVERHEAD_MS,
        "per_repeat_by_concurrency": per_repeat,
    }  # fmt: skip
    return {
        "rows": rows, "levels": levels, "requests": args.requests, "max_tokens": args.max_tokens,
        "repeats": max(1, args.repeats), "recording_overhead": summary, "reload": reload,
        "notes": _notes(args, summary, reload),
    }  # fmt: skip


def _notes(args, overhead: dict, reload: dict) -> list[str]:
    verdict = "met" if overhead["target_met"] else "NOT met"
    failed, tried = reload["failures"], reload["switches_tried"]
    notes = [f"reload: {len(failed)} of {tried} switches FAILED, the old version kept serving (see the log)"]
    return [
        *(notes if failed else []),
        f"tiny model on CPU, {args.max_tokens} max_tokens, temperature 1, {args.workers} server "
        f"worker(s); medians over {max(1, args.repeats)} repeats, latencies pooled",
        "cpu_ms_per_call: CPU time of this whole process (client + server + engine + recorder threads, "
        "flushed to broker acknowledgement) per call; the broker's own CPU is not counted",
        f"recording overhead at concurrency {overhead['concurrency']}: "
        f"{overhead['latency_p50_ms']:+.3f} ms p50 latency, {overhead['cpu_ms_per_call']:+.3f} ms CPU "
        f"per call (recording alone, paced: {overhead['recording_alone_paced_cpu_ms']:.3f} ms CPU); target < "
        f"{TARGET_OVERHEAD_MS:g} ms: {verdict}",
        "reload: load = with_adapter (waits for the generation holding the model); pause = the swap",
    ]


def _row(case: str, **values) -> dict:
    return {key: values.get(key) for key in COLUMNS} | {"case": case}


@contextmanager
def _servers(services: dict, workers: int) -> Iterator[dict[str, str]]:
    """The real aiohttp app per service on 127.0.0.1:0, in one event loop on a background thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="bench-policy-server", daemon=True)
    thread.start()
    runners = {}
    try:
        for name, service in services.items():
            runners[name] = asyncio.run_coroutine_threadsafe(_start(service, workers), loop).result(60)
        yield {name: url for name, (_, url) in runners.items()}
    finally:
        for runner, _ in runners.values():
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


async def _start(service, workers: int):
    from aiohttp import web

    from producers.policy.requests import PolicyConfig
    from producers.policy.server import create_app

    runner = web.AppRunner(create_app(PolicyConfig(workers=workers, follow=False), service), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


def _body(number: int, max_tokens: int) -> dict:
    messages = PROMPTS[number % len(PROMPTS)]
    return {"model": "policy", "messages": messages, "max_tokens": max_tokens, "temperature": 1.0,
            "seed": number}  # fmt: skip


async def _post(session, url: str, episode: str, body: dict) -> dict:
    async with session.post(f"{url}/v1/episodes/{episode}/chat/completions", json=body) as response:
        answer = await response.json()
        if response.status != 200:
            raise RuntimeError(f"policy server answered {response.status}: {str(answer)[:300]}")
        return answer


async def _load(url: str, requests: int, concurrency: int, max_tokens: int) -> dict:
    """`requests` completions with `concurrency` in flight; each on a new episode."""
    import aiohttp

    tag = uuid.uuid4().hex[:12]
    todo = list(range(requests))[::-1]
    latencies: list[float] = []
    tokens = 0

    async def client(session) -> None:
        nonlocal tokens
        while todo:
            number = todo.pop()
            started = time.perf_counter()
            answer = await _post(session, url, f"bench-{tag}-{number}", _body(number, max_tokens))
            latencies.append(time.perf_counter() - started)
            tokens += answer["usage"]["completion_tokens"]

    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "latencies": latencies, "tokens": tokens, "requests": requests}


def _flush(recorder) -> None:
    if not recorder.flush(120):
        raise RuntimeError(f"recorder: {recorder.pending} steps not acknowledged by the broker after 120 s")


def _timed_load(url: str, concurrency: int, args, recorder) -> dict:
    cpu = time.process_time()
    result = asyncio.run(_load(url, args.requests, concurrency, args.max_tokens))
    if recorder is not None:
        _flush(recorder)
    result["cpu_ms"] = (time.process_time() - cpu) / result["requests"] * 1000
    result["p50_ms"] = percentile(result["latencies"], 50) * 1000
    return result


def _serve_phase(urls: dict[str, str], recorder, levels: list[int], args) -> dict:
    """Per (level, mode) one run per repeat; the modes alternate order per repeat."""
    for mode in MODES:  # warm-up: first calls pay for lazy initialisation in torch and the recorder
        asyncio.run(_load(urls[mode], max(8, max(levels)), max(levels), args.max_tokens))
    _flush(recorder)
    runs: dict[tuple[int, str], list[dict]] = {(level, mode): [] for level in levels for mode in MODES}
    for repeat in range(max(1, args.repeats)):
        for level in levels:
            for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
                result = _timed_load(urls[mode], level, args, recorder if mode == "on" else None)
                runs[(level, mode)].append(result)
                log.info(
                    "bench policy: repeat %d, concurrency %d, recording %s: %.0f tokens/s, p50 %.1f ms",
                    repeat + 1, level, mode, result["tokens"] / result["seconds"], result["p50_ms"],
                )  # fmt: skip
    return runs


def _serve_rows(runs: dict) -> list[dict]:
    rows = []
    for (level, mode), results in runs.items():
        latencies = [x * 1000 for r in results for x in r["latencies"]]
        rows.append(
            _row(
                "serve", concurrency=level, recording=mode, requests=results[0]["requests"],
                tokens_per_s=median([r["tokens"] / r["seconds"] for r in results]),
                requests_per_s=median([r["requests"] / r["seconds"] for r in results]),
                p50_ms=percentile(latencies, 50), p99_ms=percentile(latencies, 99), max_ms=max(latencies),
                cpu_ms_per_call=median([r["cpu_ms"] for r in results]),
            )
        )  # fmt: skip
    return rows


def _overhead_rows(runs: dict, levels: list[int]) -> list[dict]:
    """Recording on - off per level, paired within each repeat (ms); the lowest level first."""
    rows = []
    for level in sorted(levels):
        pairs = list(zip(runs[(level, "on")], runs[(level, "off")], strict=True))
        p50, cpu = ([on[key] - off[key] for on, off in pairs] for key in ("p50_ms", "cpu_ms"))
        row = _row("recording overhead", concurrency=level, recording="on-off", cpu_ms_per_call=median(cpu))
        rows.append(row | {"p50_ms": median(p50), "per_repeat": {"latency_p50_ms": p50, "cpu_ms": cpu}})
    return rows


def _record_only(service, calls: int, max_tokens: int, rate: float | None = None) -> dict:
    """`step_event` + `recorder.publish` alone, one real completion `calls` times: in a burst (the
    recorder batches them) or paced at `rate` per second (one event per batch, as a server sees)."""
    from producers.policy.requests import parse_chat
    from producers.policy.service import step_event
    from producers.policy.turns import build_prompt

    engine, recorder = service.engine, service.recorder
    request = parse_chat(_body(0, max_tokens), service.models())
    prompt = build_prompt(engine, request.messages, request.tools, [])
    samples = engine.generate(prompt.token_ids, request.sampling)
    tag, durations = uuid.uuid4().hex[:12], []
    cpu = time.process_time()
    for number in range(calls):
        started = time.perf_counter()
        recorder.publish(step_event(engine, request, prompt, samples, f"rec-{tag}-{number}", 0, 1.0))
        durations.append((time.perf_counter() - started) * 1000)
        time.sleep(1 / rate if rate else 0)
    _flush(recorder)
    return _row(
        f"recording only, {f'paced {rate:.0f}/s' if rate else 'burst'}", recording="on", requests=calls,
        p50_ms=percentile(durations, 50), p99_ms=percentile(durations, 99), max_ms=max(durations),
        concurrency=1, cpu_ms_per_call=(time.process_time() - cpu) / calls * 1000,
    )  # fmt: skip


def make_checkpoint(base_dir: Path, root: Path, version: str, seed: int = 1, scale: float = 0.5) -> Path:
    """A non-zero LoRA checkpoint `<root>/<version>/adapter`, as the executor lays it out (tests too)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn_like(param) * scale)
    path = root / version
    peft_model.save_pretrained(path / "adapter")
    return path


def _reload_phase(url: str, service, base: Path, root: Path, bootstrap: str, args):
    from producers.policy.reload import PolicyReloader

    count = max(1, args.checkpoints)
    checkpoints = [make_checkpoint(base, root / "ckpt", f"c{k}", seed=k + 1) for k in range(count)]
    reloader = PolicyReloader(service, bootstrap)  # apply() only: the switches come from here
    runs = []
    for repeat in range(max(1, args.repeats)):
        runs.append(asyncio.run(_reload_run(url, reloader, checkpoints, repeat, args)))
        tried, failed = len(runs[-1]["switches"]), len(reloader.failures)
        log.info("bench policy: reload repeat %d: %d switches, %d failed so far", repeat + 1, tried, failed)
    return reloader, runs


async def _reload_run(url: str, reloader, checkpoints: list[Path], repeat: int, args) -> dict:
    """Clients send completions back to back while `args.reloads` switches happen."""
    import aiohttp

    stop = asyncio.Event()
    seen: list[list[tuple[float, str]]] = [[] for _ in range(max(1, args.reload_concurrency))]
    tag = uuid.uuid4().hex[:12]

    async def client(session, k: int) -> None:
        number = 0
        while not stop.is_set():
            answer = await _post(session, url, f"reload-{tag}-{k}-{number}", _body(number, args.max_tokens))
            seen[k].append((time.perf_counter(), answer["policy_version"]))
            number += 1

    async with aiohttp.ClientSession() as session:
        clients = [asyncio.create_task(client(session, k)) for k in range(len(seen))]
        try:
            switches = await asyncio.to_thread(_switch, reloader, checkpoints, repeat, args)
        finally:  # let the clients finish before the servers go away
            stop.set()
            await asyncio.gather(*clients)
    return {"responses": seen, "switches": switches}


def _switch(reloader, checkpoints: list[Path], repeat: int, args) -> list[str]:
    """Apply `args.reloads` updates; a failed one (the reloader logs it, the old version keeps
    serving) is counted in `reloader.failures` and reported, not raised."""
    from schemas.events import PolicyUpdated, utc_now
    from schemas.ids import new_event_id

    versions = []
    time.sleep(args.reload_interval)
    for number in range(args.reloads):
        version = f"r{repeat}-v{number}"
        event = PolicyUpdated(
            event_id=new_event_id(), trajectory_id=version, occurred_at=utc_now(), producer="bench",
            policy_version=version, previous_version=reloader.service.engine.version,
            checkpoint_path=str(checkpoints[number % len(checkpoints)]),
        )  # fmt: skip
        reloader.apply(event)
        versions.append(version)
        time.sleep(args.reload_interval)
    return versions


def _reload_summary(reloader, runs: list[dict]) -> dict:
    across, within = [], []
    for run in runs:
        for responses in run["responses"]:
            for (before, old), (after, new) in pairwise(responses):
                (across if old != new else within).append((after - before) * 1000)
    loads, pauses = reloader.load_times_ms, reloader.reload_pauses_ms
    clients = max(1, len(runs[0]["responses"])) if runs else 0

    def row(case: str, values: list[float], **extra) -> dict:
        stats = {"p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99)}
        return _row(case, requests=len(values), max_ms=max(values, default=float("nan")), **stats, **extra)

    return {
        "load_times_ms": loads, "reload_pauses_ms": pauses,
        "load_p50_ms": percentile(loads, 50), "load_p99_ms": percentile(loads, 99),
        "pause_p50_ms": percentile(pauses, 50), "pause_p99_ms": percentile(pauses, 99),
        "switch_gap_max_ms": max(across, default=float("nan")),
        "same_version_gap_p50_ms": percentile(within, 50),
        "same_version_gap_max_ms": max(within, default=float("nan")),
        "switches_tried": sum(len(run["switches"]) for run in runs), "failures": list(reloader.failures),
        "switches_seen_by_clients": len(across),
        "rows": [
            row("reload: load (with_adapter)", loads),
            row("reload: pause (swap)", pauses),
            row("reload: client gap across a switch", across, concurrency=clients),
            row("reload: client gap, same version", within, concurrency=clients),
        ],
    }  # fmt: skip


def gpu_comparison(args, root: Path) -> dict:
    """The `--gpu` rows, or why there are none."""
    if not args.gpu:
        return {"skipped": "GPU comparison not requested (--gpu)"}
    import torch

    if not torch.cuda.is_available():
        reason = (
            f"GPU comparison skipped: no CUDA device (torch {torch.__version__}, cuda.is_available() False)"
        )
        log.warning(reason)
        return {"skipped": reason}
    return compare_generate(root / "qwen2-0.5b-shape", "cuda", QWEN2_05B_SHAPE, args.max_tokens, args.repeats)


def compare_generate(
    directory: Path, device: str, shape: dict, max_tokens: int, repeats: int, prompts: int = 16
) -> dict:
    """Tokens/s of `LocalEngine.generate` and of `model.generate` (sampling, batch 1, same prompts)
    on a model of `shape` built from a config; one row each, with the ratio."""
    import torch
    from transformers import AutoModelForCausalLM

    from producers.policy.engine import LocalEngine, SamplingParams

    tokenizer, params = _model_of_shape(directory, shape)
    engine = LocalEngine(directory, device=device)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    plain = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).to(device).eval()
    inputs = [engine.render(PROMPTS[i % len(PROMPTS)]) for i in range(prompts)]

    def ours(number: int, ids: list[int]) -> int:
        return len(engine.generate(ids, SamplingParams(max_tokens=max_tokens, seed=number))[0].token_ids)

    def theirs(number: int, ids: list[int]) -> int:
        torch.manual_seed(number)
        with torch.inference_mode():
            out = plain.generate(
                torch.tensor([ids], device=device), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                max_new_tokens=max_tokens, eos_token_id=engine.stop_ids, pad_token_id=tokenizer.pad_token_id,
            )  # fmt: skip
        return out.shape[1] - len(ids)

    rates = {name: _rate(fn, inputs, device, repeats) for name, fn in (("ours", ours), ("theirs", theirs))}
    ratio = rates["ours"] / rates["theirs"]
    common = {"concurrency": 1, "requests": prompts}
    return {
        "device": device, "params": params, "tokens_per_s": rates, "ratio": ratio,
        "rows": [
            _row(f"{device}: LocalEngine.generate", tokens_per_s=rates["ours"], **common),
            _row(f"{device}: transformers model.generate", tokens_per_s=rates["theirs"], **common),
        ],
        "notes": [
            f"{device}: {params / 1e6:.1f}M-parameter Qwen2 built from a config ({shape}), "
            f"{max_tokens} max_tokens, batch 1; LocalEngine / model.generate = {ratio:.2f}x "
            "(LocalEngine also keeps each token's logprob)"
        ],
    }  # fmt: skip


def _model_of_shape(directory: Path, shape: dict):
    """Save a Qwen2 model of `shape` (random weights) and the tiny tokenizer in `directory`."""
    from consumers.tiny_model import build_model, train_tokenizer

    tokenizer = train_tokenizer()
    model = build_model(tokenizer, **shape)
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory)
    return tokenizer, sum(p.numel() for p in model.parameters())


def _rate(generate, inputs: list[list[int]], device: str, repeats: int) -> float:
    import torch

    synced = torch.cuda.synchronize if device.startswith("cuda") else lambda: None
    generate(0, inputs[0])  # warm-up
    rates = []
    for _ in range(max(1, repeats)):
        synced()
        started = time.perf_counter()
        tokens = sum(generate(number, ids) for number, ids in enumerate(inputs))
        synced()
        rates.append(tokens / (time.perf_counter() - started))
    return median(rates)

"""`agentstream bench policy`: its options, the run (one broker, the phases in order, the
`--gpu` comparison) and the summary and notes of the report.
"""

from __future__ import annotations

from pathlib import Path

from infra.bench.children import scratch_broker
from infra.bench.policy.engine_load import engine_rows
from infra.bench.policy.gpu import gpu_comparison
from infra.bench.policy.proxy import add_arguments as add_proxy_arguments
from infra.bench.policy.proxy import proxy_comparison
from infra.bench.policy.reload import reload_phase, reload_summary
from infra.bench.policy.servers import policy_servers
from infra.bench.policy.serving import (
    TARGET_OVERHEAD_MS,
    batching_note,
    batching_summary,
    overhead_rows,
    serve_phase,
    serve_rows,
    time_recording_only,
)
from infra.bench.report import median
from infra.options.env import add_option


def add_arguments(parser) -> None:
    add_option(parser, "--concurrency", default="1,8,32", help="comma-separated requests in flight")
    add_option(parser, "--requests", type=int, default=96, help="requests per level, server and repeat")
    add_option(parser, "--max-tokens", type=int, default=32, help="max_tokens of every request")
    add_option(
        parser, "--workers", type=int, default=0,
        help="server generation threads (PolicyConfig.workers); 0: the highest --concurrency, so that "
        "every request in flight reaches the engine's batch",
    )  # fmt: skip
    add_option(parser, "--reloads", type=int, default=6, help="policy switches per repeat while clients run")
    add_option(parser, "--reload-interval", type=float, default=0.5, help="seconds between switches")
    add_option(parser, "--reload-concurrency", type=int, default=8, help="clients in flight during reloads")
    add_option(parser, "--checkpoints", type=int, default=3, help="LoRA checkpoints the reloads cycle over")
    add_option(
        parser, "--gpu", action="store_true", default=False,
        help="also compare LocalEngine.generate with model.generate on a 0.5B-shaped model (needs CUDA)",
    )  # fmt: skip
    add_proxy_arguments(parser)


def run(args) -> dict:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    levels = [int(x) for x in str(args.concurrency).split(",") if x.strip()]
    if args.workers < 0:
        raise ValueError(f"--workers: must be 0 or more, got {args.workers}")
    args.workers = args.workers or max(levels)
    with scratch_broker("policy") as (root, broker):
        result = _measure(root, broker.address, levels, args)
        result["gpu"] = gpu_comparison(args, root)
        result["proxy_vllm"] = proxy_comparison(args, root, broker.address, levels)
    for part in ("gpu", "proxy_vllm"):
        result["rows"] += result[part].get("rows", [])
        result["notes"] += result[part].get("notes", [result[part].get("skipped", "")])
    return result


def _measure(root: Path, bootstrap: str, levels: list[int], args) -> dict:
    from consumers.tiny_model import tiny_model_dir
    from producers.policy.engine.local import LocalEngine
    from producers.policy.service import PolicyService
    from producers.sdk.recorder import AgentRecorder

    base = tiny_model_dir(root / "data")
    engine = LocalEngine(base, device="cpu")
    recorder = AgentRecorder(bootstrap, root / "spool", agent="policy-server", model=engine.model_name)
    services = {"off": PolicyService(engine, None), "on": PolicyService(engine, recorder)}
    try:
        alone = engine_rows(engine, levels, args)
        with policy_servers(services, args.workers) as urls:
            runs = serve_phase(urls, recorder, levels, args)
            rate = median([r["requests"] / r["seconds"] for r in runs[(min(levels), "on")]])
            record_only = [
                time_recording_only(services["on"], args.requests, args.max_tokens, x) for x in (None, rate)
            ]
            reloader, reload_runs = reload_phase(urls["on"], services["on"], base, root, bootstrap, args)
    finally:
        recorder.close(timeout=30)
    overhead = overhead_rows(runs, levels)
    serving = serve_rows(runs)
    batching = batching_summary(serving, alone)
    rows = [*serving, *alone, *overhead, *record_only]
    reload = reload_summary(reloader, reload_runs)
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
        "batching": batching, "notes": [batching_note(batching), *_notes(args, summary, reload)],
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
        "reload: load = with_checkpoint (waits for the decode step holding the model); pause = the swap",
    ]

"""Serving and what recording costs: tokens/s, requests/s and latency per concurrency with
recording on and off (the order alternating per repeat); the overhead rows (on - off, paired per
repeat; target < 2 ms per call at the lowest concurrency); and `step_event` + `recorder.publish`
timed alone, in a burst and paced.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from infra.bench.policy.client_load import (
    chat_body,
    flush_recorder,
    send_completions,
    timed_load,
)
from infra.bench.policy.table import table_row
from infra.bench.report import median, percentile

log = logging.getLogger(__name__)


TARGET_OVERHEAD_MS = 2.0
MODES = ("off", "on")  # recording


def serve_phase(urls: dict[str, str], recorder, levels: list[int], args) -> dict:
    """Per (level, mode) one run per repeat; the modes alternate order per repeat."""
    for mode in MODES:  # warm-up: first calls pay for lazy initialisation in torch and the recorder
        asyncio.run(send_completions(urls[mode], max(8, max(levels)), max(levels), args.max_tokens))
    flush_recorder(recorder)
    runs: dict[tuple[int, str], list[dict]] = {(level, mode): [] for level in levels for mode in MODES}
    for repeat in range(max(1, args.repeats)):
        for level in levels:
            for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
                result = timed_load(urls[mode], level, args, recorder if mode == "on" else None)
                runs[(level, mode)].append(result)
                log.info(
                    "bench policy: repeat %d, concurrency %d, recording %s: %.0f tokens/s, p50 %.1f ms",
                    repeat + 1, level, mode, result["tokens"] / result["seconds"], result["p50_ms"],
                )  # fmt: skip
    return runs


def serve_rows(runs: dict) -> list[dict]:
    rows = []
    for (level, mode), results in runs.items():
        latencies = [x * 1000 for r in results for x in r["latencies"]]
        rows.append(
            table_row(
                "serve", concurrency=level, recording=mode, requests=results[0]["requests"],
                tokens_per_s=median([r["tokens"] / r["seconds"] for r in results]),
                requests_per_s=median([r["requests"] / r["seconds"] for r in results]),
                p50_ms=percentile(latencies, 50), p99_ms=percentile(latencies, 99), max_ms=max(latencies),
                cpu_ms_per_call=median([r["cpu_ms"] for r in results]),
            )
        )  # fmt: skip
    return rows


def overhead_rows(runs: dict, levels: list[int]) -> list[dict]:
    """Recording on - off per level, paired within each repeat (ms); the lowest level first."""
    rows = []
    for level in sorted(levels):
        pairs = list(zip(runs[(level, "on")], runs[(level, "off")], strict=True))
        p50, cpu = ([on[key] - off[key] for on, off in pairs] for key in ("p50_ms", "cpu_ms"))
        row = table_row(
            "recording overhead", concurrency=level, recording="on-off", cpu_ms_per_call=median(cpu)
        )
        rows.append(row | {"p50_ms": median(p50), "per_repeat": {"latency_p50_ms": p50, "cpu_ms": cpu}})
    return rows


def time_recording_only(service, calls: int, max_tokens: int, rate: float | None = None) -> dict:
    """`step_event` + `recorder.publish` alone, one real completion `calls` times: in a burst (the
    recorder batches them) or paced at `rate` per second (one event per batch, as a server sees)."""
    from producers.policy.requests import parse_chat
    from producers.policy.service import step_event
    from producers.policy.turns import build_prompt

    engine, recorder = service.engine, service.recorder
    request = parse_chat(chat_body(0, max_tokens), service.models())
    prompt = build_prompt(engine, request.messages, request.tools, [])
    samples = engine.generate(prompt.token_ids, request.sampling)
    tag, durations = uuid.uuid4().hex[:12], []
    cpu = time.process_time()
    for number in range(calls):
        started = time.perf_counter()
        recorder.publish(step_event(engine, request, prompt, samples, f"rec-{tag}-{number}", 0, 1.0))
        durations.append((time.perf_counter() - started) * 1000)
        time.sleep(1 / rate if rate else 0)
    flush_recorder(recorder)
    return table_row(
        f"recording only, {f'paced {rate:.0f}/s' if rate else 'burst'}", recording="on", requests=calls,
        p50_ms=percentile(durations, 50), p99_ms=percentile(durations, 99), max_ms=max(durations),
        concurrency=1, cpu_ms_per_call=(time.process_time() - cpu) / calls * 1000,
    )  # fmt: skip


TARGET_BATCHING_RATIO = 4.0  # tokens/s at concurrency 8 over tokens/s at concurrency 1 (issue #36)


def batching_summary(rows: list[dict], engine_rows: list[dict]) -> dict:
    """The engine's batching as the serve rows show it (recording off): tokens/s per concurrency, each
    level's ratio to the lowest, and the target (at 8, at least 4x the rate at 1) when both ran; the
    same figures for the engine alone (`engine_load`)."""
    rates = {row["concurrency"]: row["tokens_per_s"] for row in rows if row["recording"] == "off"}
    alone = {row["concurrency"]: row["tokens_per_s"] for row in engine_rows}
    lowest = min(rates)
    summary = {
        "tokens_per_s": rates,
        "ratio_to_lowest": {level: rate / rates[lowest] for level, rate in rates.items()},
        "target_ratio_at_8": TARGET_BATCHING_RATIO,
        "engine_only_tokens_per_s": alone,
        "engine_only_ratio_to_lowest": {level: rate / alone[min(alone)] for level, rate in alone.items()},
    }
    if lowest == 1 and 8 in rates:
        summary["target_met"] = rates[8] / rates[1] >= TARGET_BATCHING_RATIO
    return summary


def batching_note(summary: dict) -> str:
    import torch

    rates = ", ".join(
        f"{level}: {rate:.0f} ({summary['ratio_to_lowest'][level]:.2f}x)"
        for level, rate in sorted(summary["tokens_per_s"].items())
    )
    alone = ", ".join(
        f"{level}: {rate:.0f} ({summary['engine_only_ratio_to_lowest'][level]:.2f}x)"
        for level, rate in sorted(summary["engine_only_tokens_per_s"].items())
    )
    verdict = {True: "met", False: "NOT met"}.get(summary.get("target_met"), "not measured (needs 1 and 8)")
    return (
        f"batching: tokens/s by concurrency, recording off (x the lowest): {rates}; target at 8 >= "
        f"{summary['target_ratio_at_8']:g}x the rate at 1: {verdict}; the engine alone: {alone}; "
        f"torch threads: {torch.get_num_threads()} (OMP_NUM_THREADS; on a small shared machine 1 "
        "avoids the stalls of a thread pool waiting for a busy core)"
    )

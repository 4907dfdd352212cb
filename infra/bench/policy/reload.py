"""Hot reloads under load: while clients send completions back to back,
`PolicyReloader.apply(PolicyUpdated)` switches between LoRA checkpoints; the rows are the load and
pause the reloader records, and the gap a client saw between its responses across a switch (beside
the gap within one version). `make_checkpoint` lays a checkpoint out as the executor does (tests use
it too).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from itertools import pairwise
from pathlib import Path

from infra.bench.policy.client_load import (
    chat_body,
    post_completion,
)
from infra.bench.policy.table import table_row
from infra.bench.report import percentile

log = logging.getLogger(__name__)


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


def reload_phase(url: str, service, base: Path, root: Path, bootstrap: str, args):
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
            answer = await post_completion(
                session, url, f"reload-{tag}-{k}-{number}", chat_body(number, args.max_tokens)
            )
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


def reload_summary(reloader, runs: list[dict]) -> dict:
    across, within = [], []
    for run in runs:
        for responses in run["responses"]:
            for (before, old), (after, new) in pairwise(responses):
                (across if old != new else within).append((after - before) * 1000)
    loads, pauses = reloader.load_times_ms, reloader.reload_pauses_ms
    clients = max(1, len(runs[0]["responses"])) if runs else 0

    def row(case: str, values: list[float], **extra) -> dict:
        stats = {"p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99)}
        return table_row(
            case, requests=len(values), max_ms=max(values, default=float("nan")), **stats, **extra
        )

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
            row("reload: load (with_checkpoint)", loads),
            row("reload: pause (swap)", pauses),
            row("reload: client gap across a switch", across, concurrency=clients),
            row("reload: client gap, same version", within, concurrency=clients),
        ],
    }  # fmt: skip

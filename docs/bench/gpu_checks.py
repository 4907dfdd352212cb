"""The GPU checks behind docs/benchmarks.md's "GPU checks" section, as one script for a lent GPU.

    python3 docs/bench/gpu_checks.py --out DIR              # on CUDA: the Qwen2-0.5B shape
    python3 docs/bench/gpu_checks.py --out DIR --device cpu --small   # a dry run on CPU

Writes DIR/gpu_checks.json after each section (a failed section records its traceback and the rest
still run) and logs a summary. Sections:

1. policy: `infra.bench.policy.gpu.gpu_comparison` (what `bench policy --gpu` adds): `LocalEngine.generate`
   vs transformers `model.generate`, bf16, batch 1, on a Qwen2-0.5B-shaped model built from a config
   with the tiny tokenizer (random weights, so every completion runs to max_tokens).
2. engine: `LocalEngine(device=...)` on that model: seeded sampling reproducible, logprobs finite,
   `score` against the sampled logprobs, n=8 samples in one KV-cached batch, LoRA swaps with
   `with_checkpoint` (load time, the base engine unchanged).
3. trainer: `TrainingExecutor` (LoRA, then full fine-tuning) on that model: SFT, DPO and GRPO step
   times on `bench trainer`'s rows, losses finite, a checkpoint saved, reloaded (logits, optimizer,
   state) and trained on, and its adapter loaded by `LocalEngine` (logprobs against the trainer's).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

log = logging.getLogger("gpu_checks")
SMALL_SHAPE = {"hidden_size": 64, "layers": 2}
STARTED = time.perf_counter()


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn):
    _sync()
    started = time.perf_counter()
    value = fn()
    _sync()
    return value, time.perf_counter() - started


def environment(args, work: Path) -> dict:
    import peft
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    return {
        "python": sys.version.split()[0], "torch": torch.__version__,
        "transformers": transformers.__version__, "peft": peft.__version__, "cuda_available": cuda,
        "device_name": torch.cuda.get_device_name(0) if cuda else "cpu",
        "bf16_supported": cuda and torch.cuda.is_bf16_supported(),
    }  # fmt: skip


def policy(args, work: Path) -> dict:
    from infra.bench.policy.gpu import QWEN2_05B_SHAPE, compare_generate, gpu_comparison

    if args.small:
        return compare_generate(work / "model", args.device, SMALL_SHAPE, 8, 1, prompts=2)
    namespace = argparse.Namespace(gpu=True, max_tokens=args.max_tokens, repeats=args.repeats)
    result = gpu_comparison(namespace, work)
    (work / "qwen2-0.5b-shape").rename(work / "model")  # the engine and trainer sections reuse it
    result["shape"] = QWEN2_05B_SHAPE
    return result


def _model_dir(args, work: Path) -> Path:
    """The model of section 1 (built again when that section failed)."""
    from infra.bench.policy.gpu import QWEN2_05B_SHAPE, _model_of_shape

    path = work / "model"
    if not (path / "config.json").is_file():
        _model_of_shape(path, SMALL_SHAPE if args.small else QWEN2_05B_SHAPE)
    return path


def engine(args, work: Path) -> dict:
    from infra.bench.policy.client_load import PROMPTS
    from infra.bench.policy.reload import make_checkpoint
    from producers.policy.engine.local import LocalEngine
    from producers.policy.engine.sampling import SamplingParams

    base = _model_dir(args, work)
    eng, load_s = _timed(lambda: LocalEngine(base, device=args.device))
    prompt = eng.render(PROMPTS[0])
    params = SamplingParams(max_tokens=args.max_tokens, seed=7)
    first, seconds = _timed(lambda: eng.generate(prompt, params)[0])
    again = eng.generate(prompt, params)[0]
    scored = eng.score(prompt, first.token_ids)
    greedy = eng.generate(prompt, SamplingParams(temperature=0, max_tokens=8))[0]
    many_params = SamplingParams(max_tokens=args.max_tokens, seed=3, n=8, top_p=0.9, top_k=50)
    many, many_s = _timed(lambda: eng.generate(prompt, many_params))
    out = {
        "device": eng.device, "dtype": str(eng._shared.model.dtype), "load_s": load_s,
        "tokens": len(first.token_ids), "tokens_per_s_n1": len(first.token_ids) / seconds,
        "same_seed_same_tokens": first.token_ids == again.token_ids,
        "logprobs_finite": all(math.isfinite(x) and x <= 0 for x in first.logprobs),
        "score_vs_sampled_max_abs": max(abs(a - b) for a, b in zip(scored, first.logprobs, strict=True)),
        "greedy_tokens": len(greedy.token_ids), "n8_samples": len(many),
        "n8_tokens_per_s": sum(len(s.token_ids) for s in many) / many_s,
        "n8_distinct": len({tuple(s.token_ids) for s in many}),
    }  # fmt: skip
    ckpts = [make_checkpoint(base, work / "ckpt", f"c{k}", seed=k + 1, scale=0.05) for k in (1, 2)]
    swapped, swap_s = _timed(lambda: eng.with_checkpoint(ckpts[0], "c1"))
    with_adapter = swapped.generate(prompt, params)[0]
    other, other_s = _timed(lambda: eng.with_checkpoint(ckpts[1], "c2"))
    del swapped
    gc.collect()  # the first adapter is dropped at the next use of the shared model
    second = other.generate(prompt, params)[0]
    out |= {
        "adapter_load_ms": [swap_s * 1000, other_s * 1000],
        "adapter_changes_tokens": with_adapter.token_ids != first.token_ids,
        "adapters_differ": with_adapter.token_ids != second.token_ids,
        "base_unchanged_after_swaps": eng.generate(prompt, params)[0].token_ids == first.token_ids,
        "adapter_logprobs_finite": all(math.isfinite(x) for x in second.logprobs),
        "adapters_loaded_after_drop": sorted(getattr(eng._shared.model, "peft_config", {})),
    }  # fmt: skip
    return out


def _rows(args, executor) -> dict:
    from infra.bench.trainer import _training_rows, grpo_token_rows

    data = _training_rows(argparse.Namespace(train_rows=args.train_rows))
    data["grpo"] = grpo_token_rows(executor, data["grpo"])
    return data


def _method_times(executor, data: dict, steps: int) -> dict:
    out = {}
    for method, rows in data.items():
        executor.train_rows(rows, method)  # warm-up
        runs = [_timed(lambda m=method, r=rows: executor.train_rows(r, m)) for _ in range(steps)]
        metrics = [m for m, _ in runs]
        out[method] = {
            "rows": len(rows), "step_s": sorted(s for _, s in runs)[len(runs) // 2],
            "tokens_per_s": sorted(m["tokens_per_s"] for m in metrics)[len(runs) // 2],
            "losses": [m["loss"] for m in metrics],
            "finite": all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for m in metrics),
        }  # fmt: skip
        if method == "grpo":
            out[method] |= {k: metrics[-1][k] for k in ("is_ratio_mean", "ess") if k in metrics[-1]}
    return out


def _round_trip(config, data_dir: Path, rows: list[dict]) -> tuple[dict, object]:
    """train_batch -> checkpoint v1 -> a new executor resumes it (logits, optimizer) -> v2; returns
    the figures and the resumed executor (at v2)."""
    from consumers.training.executor import TrainingExecutor

    executor = TrainingExecutor(config, data_dir)
    event, save_s = _timed(lambda: executor.train_batch(rows, "sft", "gpu-batch-1"))
    ids = executor.encode_row(rows[0]).input_ids
    before = executor.logits(ids)
    reloaded, load_s = _timed(lambda: TrainingExecutor(config, data_dir))
    diff = float((reloaded.logits(ids) - before).abs().max())
    resumed = reloaded.state.policy_version
    second = reloaded.train_batch(rows, "sft", "gpu-batch-2")
    moved = float((reloaded.logits(ids) - before).abs().max())
    return {
        "version": event.policy_version, "train_and_save_s": save_s, "reload_s": load_s,
        "reloaded_version": resumed, "logits_max_abs_diff_after_reload": diff,
        "optimizer_state_restored": bool(reloaded.optimizer.state_dict()["state"]),
        "next_version": second.policy_version, "logits_moved_after_next_step": moved,
        "ok": event.policy_version == "v1" and diff == 0.0 and second.policy_version == "v2",
    }, reloaded  # fmt: skip


def _engine_reads_trainer(args, base: Path, executor, row: dict) -> dict:
    """The executor's latest adapter checkpoint in LocalEngine: its logprobs against the trainer's."""
    import torch

    from producers.policy.engine.local import LocalEngine

    enc = executor.encode_row(row)
    cut = next(i for i, lab in enumerate(enc.labels) if lab != -100)
    ids = enc.input_ids
    logps = torch.log_softmax(executor.logits(ids), -1)
    theirs = [float(logps[i - 1, ids[i]]) for i in range(cut, len(ids))]
    checkpoint = executor.ckpt_root / executor.state.policy_version
    eng = LocalEngine(base, adapter=checkpoint, device=args.device)
    ours = eng.score(ids[:cut], ids[cut:])
    diffs = [abs(a - b) for a, b in zip(ours, theirs, strict=True)]
    return {"version": executor.state.policy_version, "tokens": len(diffs), "max_abs": max(diffs),
            "mean_abs": sum(diffs) / len(diffs)}  # fmt: skip


def _config(args, base: Path):
    from consumers.training.config import TrainConfig

    return TrainConfig(
        base_model=str(base), micro_batch_size=args.train_rows, device=args.device, max_length=1024
    )


def trainer(args, work: Path) -> dict:
    from consumers.training.executor import TrainingExecutor

    base = _model_dir(args, work)
    config = _config(args, base)
    executor, load_s = _timed(lambda: TrainingExecutor(config, work / "lora"))
    data = _rows(args, executor)
    out = {"lora_load_s": load_s, "dtype": str(next(executor.model.parameters()).dtype)}
    out["lora"] = _method_times(executor, data, args.train_steps)
    executor.config = replace(config, kl_beta=0.04)  # GRPO with the KL term (reference: adapter off)
    kl = executor.train_rows(data["grpo"], "grpo")
    out["lora_grpo_kl"] = {"loss": kl["loss"], "kl": kl["kl"], "finite": math.isfinite(kl["loss"])}
    out["lora_memory_gib"] = _peak_gib()
    del executor
    gc.collect()
    out["lora_checkpoint"], executor = _round_trip(config, work / "lora-ckpt", data["sft"])
    out["engine_reads_trainer_adapter"] = _engine_reads_trainer(args, base, executor, data["sft"][0])
    del executor
    gc.collect()
    if time.perf_counter() - STARTED > args.budget_s:
        out["full"] = f"skipped: over --budget-s {args.budget_s} s"
        return out
    full = replace(config, lora=False, learning_rate=1e-5)
    executor = TrainingExecutor(full, work / "full")
    out["full"] = _method_times(
        executor, {"sft": data["sft"], "grpo": data["grpo"]}, max(2, args.train_steps // 2)
    )
    out["full_memory_gib"] = _peak_gib()
    del executor
    gc.collect()
    out["full_checkpoint"], _ = _round_trip(full, work / "full-ckpt", data["sft"])
    return out


def _peak_gib() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="a 2-layer model: a quick dry run")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-rows", type=int, default=8)
    parser.add_argument("--train-steps", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=240, help="skip full fine-tuning after this")
    parser.add_argument("--only", default="environment,policy,engine,trainer")
    parser.add_argument("--work", type=Path, default=Path("/tmp/agentstream-gpu-checks"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    results: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    failed = 0
    for name in args.only.split(","):
        started = time.perf_counter()
        try:
            results[name] = globals()[name](args, args.work)
        except Exception:
            failed += 1
            results[name] = {"error": traceback.format_exc()}
            log.exception("section %s failed", name)
        results[name]["seconds"] = time.perf_counter() - started
        (args.out / "gpu_checks.json").write_text(json.dumps(results, indent=2, default=str))
        log.info(
            "section %s (%.1f s): %s", name, results[name]["seconds"], json.dumps(results[name], default=str)
        )
    log.info("done: %d section(s) failed", failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

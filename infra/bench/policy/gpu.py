"""`agentstream bench policy --gpu`: `LocalEngine.generate` against transformers'
`model.generate` on a Qwen2-0.5B-shaped model built from a config, same prompts, when CUDA is
available; otherwise one line saying why not. At each of `LEVELS`: the engine with that many
requests in flight from threads (its scheduler batches them), `model.generate` on batches of that
many left-padded prompts.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from pathlib import Path

from infra.bench.policy.client_load import (
    PROMPTS,
)
from infra.bench.policy.engine_load import engine_tokens
from infra.bench.policy.table import table_row
from infra.bench.report import median

log = logging.getLogger(__name__)


QWEN2_05B_SHAPE = {"hidden_size": 896, "layers": 24, "heads": 14, "kv_heads": 2, "intermediate_size": 4864}
LEVELS = (1, 8)  # requests in flight (ours), prompts per batch (theirs)


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
    """Tokens/s of `LocalEngine.generate` (1 and 8 requests in flight) and of `model.generate`
    (batches of 1 and 8), sampling, same prompts, on a model of `shape` built from a config; one row
    each, with the ratios ours / theirs per level."""
    import torch
    from transformers import AutoModelForCausalLM

    from producers.policy.engine.local import LocalEngine

    tokenizer, params = _model_of_shape(directory, shape)
    engine = LocalEngine(directory, device=device)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    plain = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).to(device).eval()
    inputs = [engine.render(PROMPTS[i % len(PROMPTS)]) for i in range(max(prompts, max(LEVELS)))]
    pad = tokenizer.pad_token_id

    def theirs(number: int, batch: list[list[int]]) -> int:
        width = max(len(ids) for ids in batch)
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in batch], device=device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch], device=device)
        torch.manual_seed(number)
        with torch.inference_mode():
            out = plain.generate(
                ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                max_new_tokens=max_tokens, eos_token_id=engine.stop_ids, pad_token_id=pad,
            )  # fmt: skip
        return sum(_completion_length(row, engine.stop_ids) for row in out[:, width:].tolist())

    rates: dict[str, dict[int, float]] = {"ours": {}, "theirs": {}}
    for level in LEVELS:
        ours = partial(engine_tokens, engine, concurrency=level, max_tokens=max_tokens)
        rates["ours"][level] = _rate(ours, inputs, device, repeats)
        rates["theirs"][level] = _rate(partial(_in_batches, theirs, level), inputs, device, repeats)
    return _report(device, params, shape, max_tokens, rates, len(inputs))


def _report(device: str, params: int, shape: dict, max_tokens: int, rates: dict, requests: int) -> dict:
    ratios = {level: rates["ours"][level] / rates["theirs"][level] for level in LEVELS}
    rows = []
    for level in LEVELS:
        for name, case in (("ours", "LocalEngine.generate"), ("theirs", "transformers model.generate")):
            rows.append(
                table_row(
                    f"{device}: {case}", tokens_per_s=rates[name][level], concurrency=level, requests=requests
                )
            )
    shown = ", ".join(f"{level}: {ratio:.2f}x" for level, ratio in ratios.items())
    return {
        "device": device, "params": params, "tokens_per_s": rates, "ratio": ratios, "rows": rows,
        "notes": [
            f"{device}: {params / 1e6:.1f}M-parameter Qwen2 built from a config ({shape}), "
            f"{max_tokens} max_tokens; LocalEngine with N requests in flight / model.generate on batches "
            f"of N = {shown} (LocalEngine also keeps each token's logprob)"
        ],
    }  # fmt: skip


def _in_batches(generate, size: int, inputs: list[list[int]]) -> int:
    return sum(generate(k, inputs[k : k + size]) for k in range(0, len(inputs), size))


def _completion_length(row: list[int], stop_ids: list[int]) -> int:
    """The sampled tokens of one `model.generate` row: up to and including its first stop token."""
    return next((k + 1 for k, token in enumerate(row) if token in stop_ids), len(row))


def _model_of_shape(directory: Path, shape: dict):
    """Save a Qwen2 model of `shape` (random weights) and the tiny tokenizer in `directory`."""
    from consumers.tiny_model import build_model, train_tokenizer

    tokenizer = train_tokenizer()
    model = build_model(tokenizer, **shape)
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory)
    return tokenizer, sum(p.numel() for p in model.parameters())


def _rate(generate, inputs: list[list[int]], device: str, repeats: int) -> float:
    """Median tokens/s of `generate(inputs)` (it returns the tokens it generated), after a warm-up."""
    import torch

    synced = torch.cuda.synchronize if device.startswith("cuda") else lambda: None
    generate(inputs[: max(LEVELS)])  # warm-up
    rates = []
    for _ in range(max(1, repeats)):
        synced()
        started = time.perf_counter()
        tokens = generate(inputs)
        synced()
        rates.append(tokens / (time.perf_counter() - started))
    return median(rates)

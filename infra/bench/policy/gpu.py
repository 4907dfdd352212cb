"""`agentstream bench policy --gpu`: `LocalEngine.generate` against transformers'
`model.generate` on a Qwen2-0.5B-shaped model built from a config, same prompts, when CUDA is
available; otherwise one line saying why not.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from infra.bench.policy.client_load import (
    PROMPTS,
)
from infra.bench.policy.table import table_row
from infra.bench.report import median

log = logging.getLogger(__name__)


QWEN2_05B_SHAPE = {"hidden_size": 896, "layers": 24, "heads": 14, "kv_heads": 2, "intermediate_size": 4864}


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

    from producers.policy.engine.local import LocalEngine
    from producers.policy.engine.sampling import SamplingParams

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
            table_row(f"{device}: LocalEngine.generate", tokens_per_s=rates["ours"], **common),
            table_row(f"{device}: transformers model.generate", tokens_per_s=rates["theirs"], **common),
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

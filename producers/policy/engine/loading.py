"""Loading from directories: the base model and its tokenizer, adapter files; device and dtype.

torch / transformers / peft are imported inside the functions; nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from producers.policy.engine.errors import EngineError, one_line

DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}
DTYPES |= {"fp32": "float32", "float32": "float32"}


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str, device: str) -> Any:
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in DTYPES:
        raise EngineError(f"dtype: unknown value {dtype!r} (expected auto, {', '.join(DTYPES)})")
    return getattr(torch, DTYPES[dtype])


def load_base(path: Path, device: str, dtype: Any) -> tuple[Any, Any]:
    """The model (eval mode, on `device`) and tokenizer saved in `path`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not path.is_dir():
        raise EngineError(f"base model {path}: no such directory")
    if not (path / "config.json").is_file():
        raise EngineError(f"base model {path}: no config.json")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except Exception as exc:
        raise EngineError(f"base model {path}: cannot load: {one_line(exc)}") from exc
    if tokenizer.chat_template is None:
        raise EngineError(f"base model {path}: the tokenizer has no chat template")
    return model.to(device).eval(), tokenizer


def adapter_dir(path: str | Path) -> Path:
    """The adapter directory of `path`: a trainer checkpoint (holding `adapter/`) or an adapter itself."""
    path = Path(path)
    if (path / "adapter" / "adapter_config.json").is_file():
        return path / "adapter"
    if (path / "adapter_config.json").is_file():
        return path
    raise EngineError(f"adapter {path}: no adapter_config.json (nor adapter/adapter_config.json)")


def read_adapter(path: Path, device: str) -> tuple[Any, dict]:
    """The adapter's config and weights, read and checked before anything touches the model."""
    from peft import PeftConfig
    from peft.utils import load_peft_weights

    try:
        config = PeftConfig.from_pretrained(path)
        weights = load_peft_weights(str(path), device=device)
    except Exception as exc:
        raise EngineError(f"adapter {path}: cannot load: {one_line(exc)}") from exc
    config.inference_mode = True
    return config, weights

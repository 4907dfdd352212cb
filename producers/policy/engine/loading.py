"""Loading from directories: the base model and its tokenizer, checkpoints (a LoRA adapter or a
full fine-tune, as the executor writes them), adapter files; device and dtype.

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


def load_base(path: Path, device: str, dtype: Any, what: str = "base model") -> tuple[Any, Any]:
    """The model (eval mode, on `device`) and tokenizer saved in `path`; errors name `what` and `path`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not path.is_dir():
        raise EngineError(f"{what} {path}: no such directory")
    if not (path / "config.json").is_file():
        raise EngineError(f"{what} {path}: no config.json")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except Exception as exc:
        raise EngineError(f"{what} {path}: cannot load: {one_line(exc)}") from exc
    if tokenizer.chat_template is None:
        raise EngineError(f"{what} {path}: the tokenizer has no chat template")
    return model.to(device).eval(), tokenizer


def checkpoint_dir(path: str | Path) -> tuple[str, Path]:
    """What `path` holds, and where: ("adapter", dir) for a LoRA adapter, ("model", dir) for a full
    model. `path` is an executor checkpoint (`vN/` holding `adapter/` or `model/`), an adapter
    directory (adapter_config.json) or a model directory (config.json)."""
    path = Path(path)
    for kind, sub, marker in (
        ("adapter", "adapter", "adapter_config.json"),
        ("model", "model", "config.json"),
    ):
        if (path / sub / marker).is_file():
            return kind, path / sub
    if (path / "adapter_config.json").is_file():
        return "adapter", path
    if (path / "config.json").is_file():
        return "model", path
    if not path.exists():
        raise EngineError(f"checkpoint {path}: no such directory")
    raise EngineError(
        f"checkpoint {path}: no adapter_config.json or config.json "
        "(nor adapter/adapter_config.json or model/config.json)"
    )


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


def check_fits_base(path: Path, model: Any, tokenizer: Any, base: Any, base_model: Any) -> None:
    """A full fine-tune served in place of the base (`base`: its engine, `base_model` its model)
    must read and write the same tokens: the same tokenizer hash, or else the same vocabulary and
    chat template; and as many token embeddings. Else EngineError naming `path`."""
    from clients.base_model import tokenizer_hash

    ours = tokenizer_hash(tokenizer, path)
    if ours != base.tokenizer_hash:
        differs = [
            what
            for what, same in (
                ("vocabulary", tokenizer.get_vocab() == base.tokenizer.get_vocab()),
                ("chat template", tokenizer.chat_template == base.tokenizer.chat_template),
            )
            if not same
        ]
        if differs:
            raise EngineError(
                f"checkpoint {path}: its tokenizer (hash {ours}) is not the base's (hash "
                f"{base.tokenizer_hash}): {' and '.join(differs)} differ"
            )
    sizes = [m.get_input_embeddings().num_embeddings for m in (model, base_model)]
    if sizes[0] != sizes[1]:
        raise EngineError(f"checkpoint {path}: {sizes[0]} token embeddings, the base has {sizes[1]}")

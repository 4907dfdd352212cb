"""Which base model a process works on: one id for the weights and config, one hash for the tokenizer.

The policy server (built-in engine and proxy), the executor and the trainer compute both from the
same base directory, so `policy.updated` can name the base a version was trained on and the server
and the trainer can refuse what was built on another. Reads files only; no torch, no transformers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

WEIGHT_SUFFIXES = (".safetensors", ".bin")
_CHUNK = 1 << 20


def base_model_id(base_dir: str | Path) -> str:
    """16 hex chars of sha256 over `config.json` and the weight files (`*.safetensors`, `*.bin`,
    top level, in name order), each fed as its name, its size and its bytes; "" when the directory
    holds no weight file (a tokenizer-only directory, as the proxy has): the base is unknown."""
    base = Path(base_dir)
    if not base.is_dir():
        return ""
    weights = sorted(p for p in base.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    if not weights:
        return ""
    digest = hashlib.sha256()
    config = base / "config.json"
    for file in ([config] if config.is_file() else []) + weights:
        digest.update(f"{file.name}\0{file.stat().st_size}\0".encode())
        with file.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def tokenizer_hash(tokenizer: Any, base_dir: str | Path) -> str:
    """16 hex chars of sha256 over tokenizer.json (or the vocabulary) and the chat template."""
    digest = hashlib.sha256()
    file = Path(base_dir) / "tokenizer.json"
    if file.is_file():
        digest.update(file.read_bytes())
    else:
        digest.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
    template = tokenizer.chat_template
    digest.update(b"\0" + (template if isinstance(template, str) else json.dumps(template)).encode())
    return digest.hexdigest()[:16]

"""Checkpoints on disk, under `<data_dir>/checkpoints`: `vN/` holds the adapter (LoRA) or the full
model and its tokenizer (`model/`), the optimizer state (`optimizer.pt`) and `state.json` (the
`TrainState`); `latest` names the newest complete one and is written last, so it is the commit
point of a checkpoint. Resuming reloads all three. torch is imported inside functions only.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from consumers.batching.batch_writer import atomic_write
from consumers.errors import TrainerError
from consumers.training.versions import TrainState


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The checkpoint `latest` names, or None (none yet, or its `state.json` is missing)."""
    pointer = ckpt_root / "latest"
    if not pointer.exists():
        return None
    path = ckpt_root / pointer.read_text().strip()
    return path if (path / "state.json").exists() else None


def read_state(checkpoint: Path) -> TrainState:
    return TrainState.from_json(json.loads((checkpoint / "state.json").read_text()))


def load_optimizer(optimizer, checkpoint: Path, device) -> None:
    import torch

    optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", map_location=device))


def save_checkpoint(ckpt_root: Path, state: TrainState, model, tokenizer, optimizer, lora: bool) -> Path:
    """Write the current version's checkpoint, then point `latest` at it."""
    import torch

    path = ckpt_root / str(state.policy_version)
    path.mkdir(parents=True, exist_ok=True)
    if lora:
        model.save_pretrained(path / "adapter")
    else:
        model.save_pretrained(path / "model")
        tokenizer.save_pretrained(path / "model")
    tmp = path / "optimizer.pt.tmp"
    torch.save(optimizer.state_dict(), tmp)
    os.replace(tmp, path / "optimizer.pt")
    atomic_write(path / "state.json", json.dumps(asdict(state), indent=2).encode())
    atomic_write(ckpt_root / "latest", path.name.encode())  # the commit point of a checkpoint
    return path


def save_state(ckpt_root: Path, state: TrainState) -> None:
    """Rewrite the current version's `state.json` (weights unchanged: a dropped batch)."""
    path = ckpt_root / str(state.policy_version)
    if state.policy_version is not None and path.is_dir():
        atomic_write(path / "state.json", json.dumps(asdict(state), indent=2).encode())


def reference_dir(ckpt_root: Path, reference: str) -> Path | None:
    """The checkpoint of `--reference vN` (its adapter or model directory); None for base."""
    if reference == "base":
        return None
    path = ckpt_root / reference
    for sub in ("adapter", "model"):
        if (path / sub).is_dir():
            return path / sub
    raise TrainerError(
        f"--reference: no checkpoint for {reference!r} "
        f"(expected {path / 'adapter'} or {path / 'model'}); give base or a trained version"
    )

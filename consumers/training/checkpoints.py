"""Checkpoints on disk, under `<data_dir>/checkpoints`: `vN/` holds the adapter (LoRA) or the full
model and its tokenizer (`model/`), the optimizer state (`optimizer.pt`) and `state.json` (the
`TrainState`); `latest` names the newest complete one and is written last, so it is the commit
point of a checkpoint. In a group of ranks only rank 0 writes; every rank reads the same directory.
Resuming reloads all three. torch is imported inside functions only.
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


def load_optimizer(optimizer, checkpoint: Path, device, names: list[str], load_full=None) -> None:
    """Load `optimizer.pt` into `optimizer` (its parameters are the model's trainable `names`, in
    order). Two layouts are read either way: by parameter index (one process, DDP) and by parameter
    name (FSDP's full state); `load_full` loads a by-name state into a sharded model's optimizer."""
    import torch

    state = torch.load(checkpoint / "optimizer.pt", map_location="cpu" if load_full else device)
    by_name = any(isinstance(k, str) for k in state.get("state", {})) or any(
        isinstance(p, str) for g in state.get("param_groups", []) for p in g["params"]
    )
    if load_full is not None:
        load_full(state if by_name else rekey_optimizer_state(state, names, to_names=True))
    else:
        optimizer.load_state_dict(rekey_optimizer_state(state, names, to_names=False) if by_name else state)


def rekey_optimizer_state(state: dict, names: list[str], *, to_names: bool) -> dict:
    """An optimizer state keyed by parameter index re-keyed by parameter name, or back.

    >>> s = {"state": {1: {"step": 3}}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]}
    >>> named = rekey_optimizer_state(s, ["a", "b"], to_names=True)
    >>> named
    {'state': {'b': {'step': 3}}, 'param_groups': [{'lr': 0.1, 'params': ['a', 'b']}]}
    >>> rekey_optimizer_state(named, ["a", "b"], to_names=False) == s
    True
    """
    index = {n: i for i, n in enumerate(names)}
    try:
        key = (lambda k: names[k]) if to_names else (lambda k: index[k])
        return {
            "state": {key(k): v for k, v in state["state"].items()},
            "param_groups": [g | {"params": [key(p) for p in g["params"]]} for g in state["param_groups"]],
        }
    except (KeyError, IndexError) as exc:
        raise TrainerError(
            f"optimizer.pt: parameter {exc.args[0]!r} is not one of the model's {len(names)} trainable "
            "parameters (a checkpoint of another model or --lora setting)"
        ) from None


def save_checkpoint(
    ckpt_root: Path,
    state: TrainState,
    model,
    tokenizer,
    optimizer,
    lora: bool,
    *,
    model_state: dict | None = None,
    optimizer_state: dict | None = None,
) -> Path:
    """Write the current version's checkpoint, then point `latest` at it. `model_state` /
    `optimizer_state`: the full states gathered from a sharded model (else read from the objects)."""
    import torch

    path = ckpt_root / str(state.policy_version)
    path.mkdir(parents=True, exist_ok=True)
    if lora:
        model.save_pretrained(path / "adapter")
    else:
        model.save_pretrained(path / "model", state_dict=model_state)
        tokenizer.save_pretrained(path / "model")
    tmp = path / "optimizer.pt.tmp"
    torch.save(optimizer.state_dict() if optimizer_state is None else optimizer_state, tmp)
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

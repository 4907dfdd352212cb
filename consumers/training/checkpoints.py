"""Checkpoints on disk, under `<data_dir>/checkpoints`: `vN/` holds the adapter (LoRA) or the full
model and its tokenizer (`model/`), the optimizer state (`optimizer.pt`) and `state.json` (the
`TrainState`); `latest` names the newest complete one and is written last, so it is the commit
point of a checkpoint. In a group of ranks only rank 0 writes; every rank reads the same directory.
Resuming reloads all three. torch is imported inside functions only.

After the evaluation gate refuses a version (`gate`), `roll_back` points `latest` at the version
serving now instead (`base/`, a `state.json` without weights, for the base model) and writes the
executor's state there: its version counter and batches go on, its weights and step are the serving
version's. The refused version's directory is left as it is (the lineage names it). A refused
version `latest` still names (the process stopped before rolling back) is rolled back when the
executor starts (`roll_back_refused`), so a restart resumes from the serving weights.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, replace
from pathlib import Path

from consumers.batching.batch_writer import atomic_write
from consumers.errors import TrainerError
from consumers.training.versions import TrainState
from schemas.policy_versions import BASE_VERSION

BASE = BASE_VERSION  # `latest` names it after a roll-back to the base model: a state.json, no weights


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
    """Rewrite the current version's `state.json` (weights unchanged: a dropped batch); `base/`'s
    after a roll-back to the base model."""
    path = ckpt_root / (state.policy_version or BASE)
    if path.is_dir():
        atomic_write(path / "state.json", json.dumps(asdict(state), indent=2).encode())


def roll_back(ckpt_root: Path, state: TrainState, version: str) -> TrainState:
    """Point `latest` at `version`'s checkpoint ("base": the base model) and write there `state`
    with `version`'s weights' version and step; returns that state. Rank 0 only."""
    if version == BASE:
        path, step = ckpt_root / BASE, 0
        path.mkdir(parents=True, exist_ok=True)
    else:
        path = ckpt_root / version
        weights = (path / "adapter").is_dir() or (path / "model").is_dir()
        if not (weights and (path / "optimizer.pt").is_file() and (path / "state.json").is_file()):
            raise TrainerError(
                f"roll back: {path} is not a complete checkpoint of {version!r} (adapter/ or model/, "
                "optimizer.pt, state.json); the executor cannot go back to the version serving now"
            )
        step = read_state(path).step
    rolled = replace(state, policy_version=None if version == BASE else version, step=step)
    atomic_write(path / "state.json", json.dumps(asdict(rolled), indent=2).encode())
    atomic_write(ckpt_root / "latest", path.name.encode())
    return rolled


def restore_target(state: TrainState) -> str | None:
    """The version to go back to when `state` is at a version the gate refused (the one it was
    compared with: "base" or "vN"); None when it is not (accepted, ungated, or rolled back already).

    >>> refused = {"policy_version": "v2", "gate": "refused", "gate_figures": {"serving_version": 1.0}}
    >>> restore_target(TrainState(policy_version="v2", last_event=refused))
    'v1'
    >>> restore_target(TrainState(policy_version="v1", last_event=refused)) is None  # rolled back
    True
    """
    event = state.last_event or {}
    if event.get("gate") != "refused" or event.get("policy_version") != state.policy_version:
        return None
    number = (event.get("gate_figures") or {}).get("serving_version")
    bad = isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number)
    if bad or number < 0 or number != int(number):
        raise TrainerError(
            f"gate: {state.policy_version} was refused against serving_version {number!r}, not a "
            "version number of this executor: cannot tell which weights to go back to"
        )
    return BASE if number == 0 else f"v{int(number)}"


def roll_back_refused(ckpt_root: Path) -> str | None:
    """When `latest` names a version the gate refused, roll back to the version it was compared
    with; returns that version (None: nothing to do). Rank 0 only, when the executor starts."""
    latest = latest_checkpoint(ckpt_root)
    state = read_state(latest) if latest is not None else None
    target = restore_target(state) if state is not None else None
    if target is not None:
        roll_back(ckpt_root, state, target)
    return target


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

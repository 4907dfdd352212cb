"""This process's place in a training group, and the few collectives the executor needs.

A group is started by `agentstream train --nproc N` (`infra.training_group`) or by `torchrun` /
`accelerate launch`: each rank reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from
its environment (`join_group`). WORLD_SIZE absent or 1 is a single process: `Ranks()` and no process
group, and every collective here is the identity. gloo on CPU, nccl on CUDA (each rank on
`cuda:<LOCAL_RANK>`).

The collective timeout is long on purpose: a dead rank is noticed by whoever launched the group
(it restarts the whole group), not by a peer timing out mid-step. It also bounds how long the other
ranks wait for rank 0's next work item, so rank 0 sends them a no-op item while it has nothing for
them (`group_work.LeadExecutor`'s keepalive, every `keepalive_interval_s`); `AGENTSTREAM_GROUP_TIMEOUT_S`
sets it (tests use a few seconds; every rank must see the same value).

RANK, LOCAL_RANK, MASTER_ADDR or MASTER_PORT without WORLD_SIZE is refused: such a process would
run alone and publish its own versions beside the rest of its intended group.

Nothing here runs at import time; torch is imported inside functions only. Bad environment values
are a `TrainerError` naming the variable and the value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from consumers.errors import TrainerError

DEFAULT_TIMEOUT_S = 3600.0
"""Collective timeout: long, so a slow rank (a long batch, a checkpoint on rank 0) is not fatal."""
TIMEOUT_ENV = "AGENTSTREAM_GROUP_TIMEOUT_S"
KEEPALIVE_S = 60.0
"""Rank 0 sends an idle item at least this often while it has no work for the other ranks."""
GROUP_VARS = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    """This process's place in the training group (one process: the defaults)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the one rank that writes checkpoints and publishes."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _int_var(env: Mapping[str, str], name: str, low: int, high: int | None = None) -> int:
    raw = env.get(name)
    if raw is None:
        raise TrainerError(
            f"{name}: not set (WORLD_SIZE > 1 needs RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)"
        )
    if not (raw.isascii() and raw.isdigit()):  # int() would take " 2", "+2", "1_0", "\u0662"
        raise TrainerError(f"{name}: expected a whole number in ASCII digits, got {raw!r}")
    value = int(raw)
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise TrainerError(f"{name}: must be {bound}, got {raw!r}")
    return value


def ranks_from_env(env: Mapping[str, str] | None = None) -> Ranks | None:
    """The group `env` describes (torchrun's variables), checked; None for a single process
    (WORLD_SIZE absent or 1). Pure: no process group is joined.

    >>> ranks_from_env({})
    >>> ranks_from_env({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1",
    ...                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    Ranks(rank=1, world_size=2, local_rank=1)
    """
    env = os.environ if env is None else env
    if env.get("WORLD_SIZE") is None:
        stray = [name for name in GROUP_VARS if name in env]
        if stray:
            raise TrainerError(
                f"{', '.join(stray)}: set ({', '.join(f'{n}={env[n]!r}' for n in stray)}) but WORLD_SIZE "
                "is not: a rank needs all of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (as "
                "torchrun sets them); unset them to train as one process, or use --nproc / torchrun"
            )
        return None
    world = _int_var(env, "WORLD_SIZE", 1)
    if world == 1:
        if env.get("RANK", "0") != "0":
            raise TrainerError(f"RANK: must be 0 when WORLD_SIZE is 1, got {env['RANK']!r}")
        return None
    rank = _int_var(env, "RANK", 0, world - 1)
    local_rank = _int_var(env, "LOCAL_RANK", 0, world - 1)
    if not (env.get("MASTER_ADDR") or "").strip():
        raise TrainerError(f"MASTER_ADDR: must name the rank 0 host, got {env.get('MASTER_ADDR')!r}")
    _int_var(env, "MASTER_PORT", 1, 65535)
    return Ranks(rank=rank, world_size=world, local_rank=local_rank)


def group_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """The collective timeout: `AGENTSTREAM_GROUP_TIMEOUT_S` when set (checked), else `DEFAULT_TIMEOUT_S`.

    >>> group_timeout_s({}), group_timeout_s({TIMEOUT_ENV: "4"})
    (3600.0, 4.0)
    """
    env = os.environ if env is None else env
    raw = env.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise TrainerError(f"{TIMEOUT_ENV}: expected seconds > 0, got {raw!r}")
    return value


def keepalive_interval_s(timeout_s: float) -> float:
    """How often rank 0 sends an idle item: `KEEPALIVE_S`, or a quarter of a shorter timeout.

    >>> keepalive_interval_s(3600.0), keepalive_interval_s(2.0)
    (60.0, 0.5)
    """
    return min(KEEPALIVE_S, timeout_s / 4)


def join_group(device: str | None, timeout_s: float | None = None) -> Ranks:
    """Join the group the environment describes (gloo on CPU, nccl on CUDA) and return this
    process's ranks; `Ranks()` without a group for a single process. Joining twice returns the
    same ranks (the group is joined once per process). `timeout_s`: default `group_timeout_s()`."""
    ranks = ranks_from_env()
    if ranks is None:
        return Ranks()
    timeout_s = group_timeout_s() if timeout_s is None else timeout_s
    if timeout_s <= 0:
        raise TrainerError(f"timeout_s: must be > 0, got {timeout_s!r}")
    import datetime

    import torch
    import torch.distributed as dist

    cuda = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if cuda:
        torch.cuda.set_device(ranks.local_rank)
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) != (ranks.rank, ranks.world_size):
            raise TrainerError(
                f"RANK/WORLD_SIZE: a process group with rank {dist.get_rank()} of "
                f"{dist.get_world_size()} is already joined, the environment says {ranks.rank} "
                f"of {ranks.world_size}"
            )
        return ranks
    dist.init_process_group(
        backend="nccl" if cuda else "gloo",
        init_method="env://",
        rank=ranks.rank,
        world_size=ranks.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return ranks


def leave_group() -> None:
    """Leave the process group, if one was joined (safe to call more than once)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _tensor_device():
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def bind_thread(ranks: Ranks) -> None:
    """Make the calling thread use this rank's CUDA device (a new thread starts on device 0), so a
    collective it runs uses the same device as the main thread's (nothing on CPU / gloo)."""
    if not ranks.distributed:
        return
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        import torch

        torch.cuda.set_device(ranks.local_rank)


def broadcast_object(ranks: Ranks, obj: T) -> T:
    """Rank 0's `obj` on every rank (picklable; the identity for one process). Other ranks' `obj`
    is ignored (pass None)."""
    if not ranks.distributed:
        return obj
    import torch.distributed as dist

    box = [obj if ranks.is_main else None]
    dist.broadcast_object_list(box, src=0, device=_tensor_device())
    return box[0]


def all_sum(ranks: Ranks, values: dict[str, float]) -> dict[str, float]:
    """Each key's sum over all ranks, the same dict on every rank (float64). Every rank must pass
    the same keys; a rank with other keys is a TrainerError on every rank, naming them."""
    if not ranks.distributed:
        return {k: float(v) for k, v in values.items()}
    import torch
    import torch.distributed as dist

    keys = sorted(values)
    every = [None] * ranks.world_size
    dist.all_gather_object(every, keys)
    if any(k != keys for k in every):
        raise TrainerError(f"all_sum: ranks passed different metric keys: {every!r}")
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=_tensor_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return dict(zip(keys, tensor.cpu().tolist(), strict=True))


def all_max(ranks: Ranks, values: dict[str, float]) -> dict[str, float]:
    """Each key's maximum over all ranks (same keys on every rank, as `all_sum`)."""
    if not ranks.distributed:
        return {k: float(v) for k, v in values.items()}
    import torch
    import torch.distributed as dist

    keys = sorted(values)
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=_tensor_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return dict(zip(keys, tensor.cpu().tolist(), strict=True))


def barrier(ranks: Ranks) -> None:
    """Wait until every rank gets here (nothing for one process)."""
    if ranks.distributed:
        import torch.distributed as dist

        dist.barrier()


def share(ranks: Ranks, items: list[Any]) -> list[Any]:
    """This rank's share of `items`: every world_size-th item from position `rank` (the same
    `items` on every rank gives disjoint shares that cover them all).

    >>> share(Ranks(rank=1, world_size=2), list("abcde"))
    ['b', 'd']
    """
    return items[ranks.rank :: ranks.world_size]


# --- the training step across ranks ---------------------------------------------------------------


def plan_steps(micro_batches: int, accumulation: int, ranks: Ranks) -> list[tuple[list[int | None], int]]:
    """Per optimizer step: this rank's micro batch indices and the step's micro batch count over
    all ranks. A step holds `accumulation * world_size` micro batches (the last one fewer); each rank
    takes its `share`, padded with None (a zero-weight pass) so every rank runs the same number of
    forward/backward passes: the collectives of DDP/FSDP then line up.

    >>> plan_steps(3, 2, Ranks())
    [([0, 1], 2), ([2], 1)]
    >>> plan_steps(3, 1, Ranks(rank=1, world_size=2))
    [([1], 2), ([None], 1)]
    """
    per_step = accumulation * ranks.world_size
    plan = []
    for start in range(0, micro_batches, per_step):
        ids = list(range(start, min(start + per_step, micro_batches)))
        mine: list[int | None] = list(share(ranks, ids))
        slots = -(-len(ids) // ranks.world_size)
        plan.append((mine + [None] * (slots - len(mine)), len(ids)))
    return plan


def wrap_model(model, ranks: Ranks, *, sharded: bool, device):
    """The module to train through: `model` itself for one process; DDP around it (replicated,
    LoRA) or FSDP2 `fully_shard` on each decoder layer and the root (sharded, full fine-tune; in
    place, so `model` is then the sharded module). Buffers are not broadcast per forward (they are
    constants here, and a broadcast would be one more collective per pass)."""
    if not ranks.distributed:
        return model
    if sharded:
        from torch.distributed.fsdp import fully_shard

        for layer in _decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)


def _decoder_layers(model) -> list:
    for path in ("model.layers", "base_model.model.model.layers", "transformer.h"):
        node = model
        for name in path.split("."):
            node = getattr(node, name, None)
        if node is not None:
            return list(node)
    return []


def gradient_sync(module, sync: bool):
    """A context for one backward pass: gradients reduced across ranks only when `sync` (the last
    pass of an optimizer step), accumulated locally otherwise."""
    import contextlib

    if not sync and hasattr(module, "no_sync"):  # DDP
        return module.no_sync()
    if hasattr(module, "set_requires_gradient_sync"):  # FSDP2
        module.set_requires_gradient_sync(sync)
    return contextlib.nullcontext()


def full_state(model, optimizer, ranks: Ranks, *, sharded: bool) -> tuple[dict | None, dict | None]:
    """(model state, optimizer state) gathered whole on rank 0 from a sharded model (a collective:
    every rank calls it; other ranks get (None, None)); (None, None) when not sharded (the model
    and optimizer hold them whole already)."""
    if not (sharded and ranks.distributed):
        return None, None
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=options)
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=options)
    return (model_state, optimizer_state) if ranks.is_main else (None, None)


def load_full_optimizer(model, optimizer, state: dict) -> None:
    """Load an optimizer state keyed by parameter names (`full_state`'s) into a sharded model's
    optimizer (every rank passes the whole state)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def scalar(value) -> float:
    """A float from a tensor or a DTensor (FSDP's gradient norm)."""
    return float(value.full_tensor() if hasattr(value, "full_tensor") else value)

"""A training group in one test: N rank processes (spawned, with torchrun's environment) that each
build a `TrainingExecutor` and train the same batches, for comparing against one process.

`run_group(cases, world_size, out_dir)` runs every case in one group (one start-up for all of them):
a case is (name, TrainConfig as a dict, data_dir, rows, method). Each rank writes
`<out_dir>/<name>.rank<R>.json`: the event's metrics, its policy version and its event id.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, cases: list, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch

    from consumers.training import distributed
    from consumers.training.config import TrainConfig
    from consumers.training.executor import TrainingExecutor

    torch.set_num_threads(1)  # two ranks share two busy cores
    ranks = distributed.join_group("cpu", timeout_s=300)
    try:
        for name, config, data_dir, rows, method in cases:
            executor = TrainingExecutor(TrainConfig(**config), data_dir, ranks)
            event = executor.train_batch(rows, method, f"batch-{name}")
            record = {"metrics": event.metrics, "version": event.policy_version, "event_id": event.event_id}
            Path(out_dir, f"{name}.rank{rank}.json").write_text(json.dumps(record))
    finally:
        distributed.leave_group()


def run_group(cases: list[tuple[str, dict[str, Any], str, list[dict], str]], world_size: int, out_dir: Path):
    """Run `cases` in a group of `world_size` spawned ranks; raises if any rank fails."""
    import torch.multiprocessing as mp

    mp.start_processes(
        _rank_main,
        args=(world_size, free_port(), cases, str(out_dir)),
        nprocs=world_size,
        join=True,
        start_method="spawn",
    )
    return {
        name: [json.loads((out_dir / f"{name}.rank{r}.json").read_text()) for r in range(world_size)]
        for name, *_ in cases
    }

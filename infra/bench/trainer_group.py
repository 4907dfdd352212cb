"""`agentstream bench trainer --nproc 1,2`: GRPO + LoRA training tokens/s per process count.

Each count N runs as a real training group: `infra.training_group.TrainingGroup` launches N ranks
of this module (`python -m infra.bench.trainer_group`, through `infra.runtime`), gloo on CPU, the
cores shared out between them (OMP_NUM_THREADS = cores // N, as `agentstream train --nproc` does).
Every count trains on the same global batch (the bench's GRPO token rows, `--train-rows` of them,
`--group-micro-batch-size` rows per micro batch): N ranks share each optimizer step's micro batches,
so the tokens are the same and only the time differs. Rank 0 writes the executor's `tokens_per_s`
(tokens summed over ranks / the slowest rank's time) of each timed call after one warm-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from infra.bench.report import median

DEVICE = "cpu"  # several ranks on one GPU is not a group nccl runs; this measures gloo on CPU


def nproc_list(text: str) -> tuple[int, ...]:
    """`--nproc 1,2` as numbers.

    >>> nproc_list("1, 2,4")
    (1, 2, 4)
    """
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        counts = ()
    if not counts or any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(f"--nproc: expected comma-separated counts >= 1, got {text!r}")
    return counts


def group_rows(args, ctx: dict) -> tuple[list[dict], dict[str, list[float]]]:
    """One table row per process count in `args.nproc` (median tokens/s, speed-up against the
    first count), and every timed call's tokens/s per count for the JSON."""
    from infra.runtime import python_module_argv
    from infra.training_group import TrainingGroup

    rows, rates, first = [], {}, None
    with tempfile.TemporaryDirectory(prefix="bench-group-") as tmp:
        work = Path(tmp)
        batch = work / "rows.json"
        batch.write_text(json.dumps(ctx["data"]["grpo"]))
        for n in args.nproc:
            out = work / f"nproc-{n}.json"
            argv = python_module_argv(
                "infra.bench.trainer_group", str(ctx["data_dir"]), str(batch), str(out),
                str(args.train_steps), str(args.group_micro_batch_size),
            )  # fmt: skip
            if TrainingGroup(argv, n, max_restarts=0).run() != 0 or not out.exists():
                raise RuntimeError(
                    f"bench trainer --nproc {n}: the group failed (its ranks' output is above)"
                )
            result = json.loads(out.read_text())
            rate = median(result["tokens_per_s"])
            first = first or rate
            rates[str(n)] = result["tokens_per_s"]
            rows.append({
                "processes": n, "threads_per_rank": result["threads"], "rows": len(ctx["data"]["grpo"]),
                "tokens_per_s": rate, f"vs_{args.nproc[0]}": f"{rate / first:.2f}x",
            })  # fmt: skip
    return rows, rates


def rank_main(argv: list[str]) -> int:
    """One rank: `DATA_DIR ROWS_JSON OUT_JSON STEPS MICRO_BATCH_SIZE` (the model is in DATA_DIR)."""
    import torch

    from consumers.training.config import TrainConfig
    from consumers.training.distributed import join_group, leave_group
    from consumers.training.executor import TrainingExecutor

    data_dir, rows_path, out, steps, micro = argv
    ranks = join_group(DEVICE)
    try:
        config = TrainConfig(base_model="tiny", micro_batch_size=int(micro), device=DEVICE, max_length=1024)
        executor = TrainingExecutor(config, data_dir, ranks)
        rows = json.loads(Path(rows_path).read_text())
        executor.train_rows(rows, "grpo")  # warm-up
        rates = [executor.train_rows(rows, "grpo")["tokens_per_s"] for _ in range(int(steps))]
    finally:
        leave_group()
    if ranks.is_main:
        Path(out).write_text(json.dumps({"tokens_per_s": rates, "threads": torch.get_num_threads()}))
    return 0


if __name__ == "__main__":
    sys.exit(rank_main(sys.argv[1:]))

"""`agentstream bench trainer`: batch-building trajectories/s per builder, and training tokens/s.

Builders run on synthetic scored trajectories (groups of 4 per task, 3 steps each). Training runs
the executor (LoRA by default) on the tiny local model on CPU, or any size built from a config
(`--hidden-size`, `--layers`) on `--device cuda`; TRL's SFTTrainer / DPOTrainer run on the same rows
in the same process for a ratio. GRPO runs on token rows carrying behaviour logprobs, twice: with the
off-policy correction (TIS, the default) and with `is_correction="none"`, for the correction's cost.
Heavy imports happen inside `run`.
"""

from __future__ import annotations

import copy
import logging
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from infra.bench.report import median
from infra.bench.trainer_group import group_rows, nproc_list
from infra.options.env import add_option

log = logging.getLogger(__name__)


def add_arguments(parser) -> None:
    add_option(parser, "--trajectories", type=int, default=2000, help="trajectories through each builder")
    add_option(parser, "--train-steps", type=int, default=6, help="optimizer steps timed per method")
    add_option(parser, "--train-rows", type=int, default=8, help="rows per training step")
    add_option(parser, "--hidden-size", type=int, default=64, help="model built from config: hidden size")
    add_option(parser, "--layers", type=int, default=2, help="model built from config: layers")
    add_option(
        parser, "--intermediate-size", type=int, help="model built from config: MLP size (default 2x hidden)"
    )
    add_option(parser, "--heads", type=int, default=4, help="model built from config: attention heads")
    add_option(parser, "--kv-heads", type=int, default=2, help="model built from config: key/value heads")
    add_option(parser, "--device", help="cpu / cuda (default: cuda when available)")
    add_option(parser, "--lora", action="store_true", default=True, help="LoRA (--no-lora: full fine-tuning)")
    add_option(
        parser, "--trl", action="store_true", default=True, help="also time TRL's trainers on the same rows"
    )
    add_option(
        parser,
        "--nproc",
        type=nproc_list,
        help="also time GRPO + LoRA in training groups of these sizes on CPU (gloo), e.g. 1,2",
    )
    add_option(parser, "--group-micro-batch-size", type=int, default=2, help="--nproc: rows per micro batch")


def synthetic(n: int, group_size: int = 4, steps: int = 3):
    from schemas.events import ScoredStep, TrajectoryScored

    tools = ("bash", "read_file", "write_file")
    out = []
    for i in range(n):
        task, member = i // group_size, i % group_size
        body = [
            ScoredStep(
                step_index=s,
                thought=f"step {s}: inspect the repository and decide",
                tool=tools[(s + member) % 3],
                params={"arg": f"{task}-{s}-{member}"},
                observation=f"output line {s} " * 12,
                process_score=((s + member) % 5) / 4,
            )
            for s in range(steps)
        ]
        reward = ((member * 7 + task) % 11) / 10
        out.append(
            TrajectoryScored(
                event_id=f"e{i}", trajectory_id=f"t{i:06d}", occurred_at="2026-01-01T00:00:00Z",
                producer="bench", task_id=f"task-{task}", task=f"Fix the failing test of task {task}.",
                group_id=f"g{task}", success=member % 2 == 0, steps=body, total_reward=reward,
            )
        )  # fmt: skip
    return out


def _rate(fn, n: int, repeats: int) -> float:
    rates = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn()
        rates.append(n / (time.perf_counter() - start))
    return median(rates)


def _grouped(trajectories, size=4):
    return [trajectories[i : i + size] for i in range(0, len(trajectories), size)]


def builder_rows(args, tokenizer) -> list[dict]:
    from consumers.batching.builders.dpo import DPOPairBuilder, StepPairBuilder
    from consumers.batching.builders.grpo import GRPOGroupBuilder, GRPOGroupConfig
    from consumers.batching.builders.sft import SFTBuilder
    from consumers.batching.config import PlannerConfig
    from consumers.batching.planner import Planner
    from consumers.batching.tokenize import SFTTokenizedBuilder
    from schemas.records import Record

    ts = synthetic(args.trajectories)
    groups = _grouped(ts)
    grpo = GRPOGroupBuilder(GRPOGroupConfig(retokenize=True))  # synthetic steps carry no token ids
    few = ts[: max(50, args.trajectories // 20)]

    def planner():
        p = Planner(PlannerConfig(batch_trajectories=256))
        for i, t in enumerate(ts):
            p.offer(t, Record("trajectory.scored", 0, i), now=0.0)
        p.due(now=0.0, force=True)

    cases = [
        ("sft (messages)", lambda: SFTBuilder().build(ts), len(ts)),
        ("dpo (trajectory pairs)", lambda: [DPOPairBuilder().build(g) for g in groups], len(ts)),
        ("dpo_step (step pairs)", lambda: [StepPairBuilder().build(g) for g in groups], len(ts)),
        ("grpo (groups + advantages)", lambda: [grpo.build(g) for g in groups], len(ts)),
        ("planner, all 4 kinds", planner, len(ts)),
        ("sft_tokenized (tiny tokenizer)", lambda: SFTTokenizedBuilder(tokenizer).build(few), len(few)),
    ]
    return [
        {
            "stage": f"build {name}",
            "trajectories": n,
            "per_s": _rate(fn, n, args.repeats),
            "unit": "trajectories/s",
        }
        for name, fn, n in cases
    ]


def _training_rows(args):
    from consumers.batching.builders.dpo import DPOPairConfig, StepPairBuilder
    from consumers.batching.builders.grpo import GRPOGroupBuilder, GRPOGroupConfig
    from consumers.batching.builders.sft import SFTBuilder, SFTBuilderConfig

    ts = synthetic(max(64, args.train_rows * 4))
    sft = SFTBuilder(SFTBuilderConfig(require_success=False)).build(ts)[: args.train_rows]
    dpo = [r for g in _grouped(ts) for r in StepPairBuilder(DPOPairConfig(max_pairs_per_group=2)).build(g)]
    builder = GRPOGroupBuilder(GRPOGroupConfig(retokenize=True))  # synthetic steps carry no token ids
    grpo = [r for g in _grouped(ts) for r in builder.build(g)][: args.train_rows]
    return {"sft": sft, "dpo": dpo[: args.train_rows], "grpo": grpo}


def training_rows(args, data_dir: Path) -> tuple[list[dict], dict]:
    from consumers.tiny_model import build_model, train_tokenizer
    from consumers.training.config import TrainConfig
    from consumers.training.executor import TrainingExecutor

    tokenizer = train_tokenizer()
    model_dir = data_dir / "models" / "tiny"
    tokenizer.save_pretrained(model_dir)
    shape = {"intermediate_size": args.intermediate_size, "heads": args.heads, "kv_heads": args.kv_heads}
    model = build_model(tokenizer, hidden_size=args.hidden_size, layers=args.layers, **shape)
    model.save_pretrained(model_dir)
    params = sum(p.numel() for p in model.parameters())
    config = TrainConfig(
        base_model="tiny",
        micro_batch_size=args.train_rows,
        device=args.device,
        lora=args.lora,
        max_length=1024,
    )
    executor = TrainingExecutor(config, data_dir)
    data = _training_rows(args)
    data["grpo"] = grpo_token_rows(executor, data["grpo"])
    unit = f"tokens/s ({executor._device()}, {'LoRA' if args.lora else 'full'})"
    rows, ours = [], {}
    for method, batch in data.items():
        ours[method] = _train_rate(executor, batch, method, args.train_steps)
        stage = (
            "train grpo, TIS correction (agentstream)"
            if method == "grpo"
            else f"train {method} (agentstream)"
        )
        rows.append({"stage": stage, "trajectories": len(batch), "per_s": ours[method], "unit": unit})
    plain = TrainingExecutor(replace(config, is_correction="none"), data_dir)
    rate = _train_rate(plain, data["grpo"], "grpo", args.train_steps)
    ratio = ours["grpo"] / rate if rate else float("nan")
    stage = "train grpo, no correction (agentstream)"
    rows.append({"stage": stage, "trajectories": len(data["grpo"]), "per_s": rate})
    rows[-1]["unit"] = f"{unit}; with/without correction = {ratio:.2f}x"
    return rows, {
        "tokenizer": tokenizer,
        "model_dir": model_dir,
        "data": data,
        "ours": ours,
        "params": params,
        "data_dir": data_dir,
    }


def _train_rate(executor, batch: list[dict], method: str, steps: int) -> float:
    """Median tokens/s of `steps` calls after one warm-up."""
    executor.train_rows(batch, method)
    return median([executor.train_rows(batch, method)["tokens_per_s"] for _ in range(steps)])


def grpo_token_rows(executor, rows: list[dict]) -> list[dict]:
    """GRPO rows in the token shape the policy server's records give, with a behaviour logprob on
    every trainable token (varied, so the importance weights are not all 1)."""
    out = []
    for row in rows:
        enc = executor.encode_row(row)
        behaviour = [None if lab == -100 else -2.0 - 0.25 * (j % 9) for j, lab in enumerate(enc.labels)]
        keep = ("advantage", "step_advantages", "group_id", "group_size", "trajectory_id", "task_id")
        out.append({k: row.get(k) for k in keep} | {
            "input_ids": enc.input_ids, "labels": enc.labels, "step_ids": enc.steps,
            "behaviour_logprobs": behaviour, "behaviour_version": "base", "reward": row.get("reward"),
        })  # fmt: skip
    return out


def trl_rows(args, ctx: dict, work: Path) -> list[dict]:
    import datasets
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    rows = []
    common = {
        "max_steps": args.train_steps + 1,
        "per_device_train_batch_size": args.train_rows,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "learning_rate": 2e-4,
        "use_cpu": (args.device or "") == "cpu" or not _cuda(),
        "logging_steps": 1,
    }
    for method in ("sft", "dpo"):
        model = AutoModelForCausalLM.from_pretrained(ctx["model_dir"])
        peft_config = _peft_config() if args.lora else None
        data = ctx["data"][method]
        tok = ctx["tokenizer"]
        repeat = args.train_steps + 1
        if method == "sft":
            ds = datasets.Dataset.from_list([{"messages": r["messages"]} for r in data] * repeat)
            config = SFTConfig(output_dir=str(work / "trl-sft"), assistant_only_loss=True, **common)
            trainer = SFTTrainer(
                model=model, args=config, train_dataset=ds, processing_class=tok, peft_config=peft_config
            )
        else:
            ds = datasets.Dataset.from_list(
                [{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in data] * repeat
            )
            ref = None if args.lora else copy.deepcopy(model)
            config = DPOConfig(output_dir=str(work / "trl-dpo"), **common)
            trainer = DPOTrainer(
                model=model,
                ref_model=ref,
                args=config,
                train_dataset=ds,
                processing_class=tok,
                peft_config=peft_config,
            )
        rate = _trl_rate(trainer)
        ratio = ctx["ours"][method] / rate if rate else float("nan")
        stage = f"train {method} (TRL {method.upper()}Trainer)"
        unit = f"tokens/s (agentstream/TRL = {ratio:.2f}x)"
        rows.append({"stage": stage, "trajectories": len(data), "per_s": rate, "unit": unit})
    return rows


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _peft_config():
    from peft import LoraConfig

    return LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )


def _trl_rate(trainer) -> float:
    """Tokens/s over the steps after the first (TRL logs `num_tokens` cumulatively)."""
    start_times: list[float] = []

    from transformers import PrinterCallback, TrainerCallback

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            start_times.append(time.perf_counter())

    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(Clock())
    trainer.train()
    logs = [h for h in trainer.state.log_history if "num_tokens" in h]
    if len(logs) < 2 or len(start_times) < 2:
        return float("nan")
    tokens = float(logs[-1]["num_tokens"]) - float(logs[0]["num_tokens"])
    return tokens / (start_times[-1] - start_times[0])


def run(args) -> dict:
    from transformers.utils import logging as hf_logging

    from consumers.tiny_model import train_tokenizer

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        work = Path(tmp)
        rows = builder_rows(args, train_tokenizer())
        train, ctx = training_rows(args, work)
        rows += train
        notes = [
            "builders: pure Python on synthetic trajectories (4 per task, 3 steps); medians over --repeats",
            f"training: model built from config (hidden {args.hidden_size}, {args.layers} layers, "
            f"{ctx['params'] / 1e6:.1f}M parameters), "
            f"{args.train_rows} rows/step, median of {args.train_steps} steps after one warm-up",
        ]
        if args.trl:
            rows += trl_rows(args, ctx, work)
            notes.append(
                "TRL tokens/s counts TRL's num_tokens (all non-pad tokens, like ours) between step ends"
            )
        result = {"rows": rows, "notes": notes}
        if args.nproc:
            title = "Training groups: GRPO + LoRA, the same global batch per process count (CPU, gloo)"
            result["group"], result["group_tokens_per_s"] = group_rows(args, ctx)
            result["tables"] = {title: "group"}
            notes.append(
                f"groups: --nproc {','.join(map(str, args.nproc))}, {args.train_rows} rows, "
                f"{args.group_micro_batch_size} per micro batch (the ranks share each step's micro batches), "
                "cores shared out (OMP_NUM_THREADS = cores / N); tokens summed over ranks / slowest rank's "
                f"time, median of {args.train_steps} calls after one warm-up"
            )
    return result

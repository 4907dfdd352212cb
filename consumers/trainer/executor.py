"""The training executor: SFT, DPO and GRPO steps on batch files, with LoRA, checkpoints and
`policy.updated` events. torch / transformers / peft are imported inside functions only.

- SFT: token NLL on assistant tokens only (observations and prompts are -100), optionally
  step-weighted (w_s = p_s / mean p; a step without a process score weighs 1, never 0).
- DPO: the reference is the same model with the LoRA adapter disabled (`model.disable_adapter()`);
  in full fine-tuning a frozen copy is made once.
- GRPO: clipped surrogate with the batch's advantages (per step when the batch has step
  advantages); old logprobs from the batch when every trainable token has one (sampled by the
  producer), else computed once under no_grad before the update.
- bf16 on GPU, fp32 on CPU. A checkpoint is the adapter (or full model), the optimizer state and
  `state.json` (step, policy version, batches trained): resuming reloads all three.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from consumers.errors import TrainerError
from consumers.trainer.batch_writer import atomic_write
from consumers.trainer.chat import Message
from consumers.trainer.config import TrainConfig
from consumers.trainer.losses import (
    IGNORE_INDEX,
    dpo_loss,
    grpo_loss,
    sequence_logps,
    sft_loss,
    token_logprobs,
)
from consumers.trainer.tokenize import Encoded, encode_messages
from schemas.events import PolicyUpdated, utc_now
from schemas.ids import derived_event_id

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    step: int = 0
    policy_version: str | None = None
    batches: list[str] = field(default_factory=list)
    last_event: dict[str, Any] | None = None


def _prompt_length(messages: list[Message]) -> int:
    return next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))


def _clean(messages: list[Message]) -> list[Message]:
    """Drop keys that datasets/parquet filled with None, so templates see what producers wrote."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def step_weights(steps: list[int], rewards: list[float | None] | None) -> list[float]:
    """Per-token weight from its step's process reward (w_s = p_s / mean of present p; else 1).

    >>> step_weights([-1, 0, 0, 1], [0.25, 0.75])
    [1.0, 0.5, 0.5, 1.5]
    """
    present = [r for r in rewards or [] if r is not None]
    mean = sum(present) / len(present) if present else 0.0
    out = []
    for s in steps:
        r = rewards[s] if rewards and 0 <= s < len(rewards) else None
        out.append(r / mean if r is not None and mean > 0 else 1.0)
    return out


class TrainingExecutor:
    """Owns the model, the optimizer and the checkpoints under `<data_dir>/checkpoints`."""

    def __init__(self, config: TrainConfig, data_dir: str | Path):
        self.config = config
        self.data_dir = Path(data_dir)
        self.ckpt_root = self.data_dir / "checkpoints"
        self.state = TrainState()
        self._ref_model = None
        self._load()

    # --- model ----------------------------------------------------------------------------------

    def _device(self):
        import torch

        return torch.device(self.config.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    def base_path(self) -> Path:
        if self.config.base_model == "tiny":
            from consumers.trainer.tiny import tiny_model_dir

            return tiny_model_dir(self.data_dir)
        path = Path(self.config.base_model)
        if not path.exists():
            raise TrainerError(
                f"--base-model: {self.config.base_model!r} is not a local directory (or 'tiny')"
            )
        return path

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        torch.manual_seed(self.config.seed)
        device = self._device()
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        base = self.base_path()
        self.tokenizer = AutoTokenizer.from_pretrained(base)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        latest = self.latest_checkpoint()
        if latest is not None and not self.config.lora:
            base = latest / "model"
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
        if self.config.lora:
            model = self._with_adapter(model, latest)
        self.model = model.to(device)
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=self.config.learning_rate, weight_decay=self.config.weight_decay
        )
        if latest is not None:
            self._resume(latest)

    def _with_adapter(self, model, checkpoint: Path | None):
        from peft import LoraConfig, PeftModel, get_peft_model

        if checkpoint is not None:
            return PeftModel.from_pretrained(model, checkpoint / "adapter", is_trainable=True)
        lora = LoraConfig(
            r=self.config.lora_r,
            lora_alpha=self.config.lora_alpha,
            lora_dropout=self.config.lora_dropout,
            target_modules=self.config.target_modules,
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, lora)

    def _resume(self, checkpoint: Path) -> None:
        import torch

        self.optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", map_location=self._device()))
        self.state = TrainState(**json.loads((checkpoint / "state.json").read_text()))
        log.info("executor: resumed %s at step %d", self.state.policy_version, self.state.step)

    def latest_checkpoint(self) -> Path | None:
        pointer = self.ckpt_root / "latest"
        if not pointer.exists():
            return None
        path = self.ckpt_root / pointer.read_text().strip()
        return path if (path / "state.json").exists() else None

    # --- rows -> tensors -----------------------------------------------------------------------

    def encode_row(self, row: dict[str, Any], completion_key: str | None = None) -> Encoded:
        """A row (pre-tokenized, `messages`, or `prompt` + completion) as ids, labels and step ids."""
        if "input_ids" in row:
            return Encoded(list(row["input_ids"]), list(row["labels"]), list(row.get("step_ids") or []))
        tools = row.get("tools") or None
        if "messages" in row:
            messages = _clean(row["messages"])
            return encode_messages(self.tokenizer, messages, tools, train_from=_prompt_length(messages))
        prompt = _clean(row["prompt"])
        completion = _clean(row[completion_key or "completion"])
        kw = {}
        if completion_key is None and row.get("step_token_ids") and row.get("step_logprobs"):
            kw = {"step_tokens": row["step_token_ids"], "step_logprobs": row["step_logprobs"]}
        return encode_messages(self.tokenizer, prompt + completion, tools, train_from=len(prompt), **kw)

    def _collate(
        self, encoded: list[Encoded], extra: list[list[float]] | None = None, keep_end: bool = False
    ):
        import torch

        limit = self.config.max_length
        cut = (lambda xs: xs[-limit:]) if keep_end else (lambda xs: xs[:limit])
        rows = [(cut(e.input_ids), cut(e.labels)) for e in encoded]
        width = max(len(ids) for ids, _ in rows)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        values = torch.zeros((len(rows), width)) if extra is not None else None
        for i, (row_ids, row_labels) in enumerate(rows):
            ids[i, : len(row_ids)] = torch.tensor(row_ids)
            labels[i, : len(row_ids)] = torch.tensor(row_labels)
            attention[i, : len(row_ids)] = 1
            if values is not None:
                values[i, : len(row_ids)] = torch.tensor(cut(extra[i]), dtype=torch.float32)
        device = self._device()
        return (
            ids.to(device),
            labels.to(device),
            attention.to(device),
            (None if values is None else values.to(device)),
        )

    def _logits(self, ids, attention, model=None):
        return (model or self.model)(input_ids=ids, attention_mask=attention).logits

    # --- losses per method ---------------------------------------------------------------------

    def _sft_micro(self, rows: list[dict[str, Any]]):
        encoded = [self.encode_row(r) for r in rows]
        weights = None
        if self.config.step_weighted_loss:
            weights = [
                step_weights(e.steps or [-1] * len(e.input_ids), r.get("step_rewards"))
                for e, r in zip(encoded, rows, strict=True)
            ]
        ids, labels, attention, w = self._collate(encoded, weights)
        return sft_loss(self._logits(ids, attention), labels, w), int(attention.sum())

    def _reference_logps(self, ids, labels, attention):
        import torch

        with torch.no_grad():
            if self.config.lora:
                with self.model.disable_adapter():
                    return sequence_logps(self._logits(ids, attention), labels)
            if self._ref_model is None:
                import copy

                self._ref_model = copy.deepcopy(self.model).eval()
            return sequence_logps(self._logits(ids, attention, self._ref_model), labels)

    def _dpo_micro(self, rows: list[dict[str, Any]]):
        import torch

        encoded = [self.encode_row(r, "chosen") for r in rows] + [
            self.encode_row(r, "rejected") for r in rows
        ]
        ids, labels, attention, _ = self._collate(encoded, keep_end=True)
        ref = self._reference_logps(ids, labels, attention)
        policy = sequence_logps(self._logits(ids, attention), labels)
        n = len(rows)
        loss = dpo_loss(policy[:n], policy[n:], ref[:n], ref[n:], self.config.beta)
        with torch.no_grad():
            margin = ((policy[:n] - ref[:n]) - (policy[n:] - ref[n:])).mean().item()
        return loss, int(attention.sum()), {"reward_margin": margin}

    def _grpo_tensors(self, rows: list[dict[str, Any]]):
        encoded = [self.encode_row(r) for r in rows]
        advantages = []
        for e, r in zip(encoded, rows, strict=True):
            per_step = r.get("step_advantages")
            advantages.append([
                per_step[s] if per_step and 0 <= s < len(per_step) else float(r["advantage"]) for s in e.steps
            ])  # fmt: skip
        ids, labels, attention, adv = self._collate(encoded, advantages)
        old = None
        if all(
            lp is not None
            for e in encoded
            for lp, lab in zip(e.logprobs, e.labels, strict=True)
            if lab != IGNORE_INDEX
        ):
            old_values = [[lp if lp is not None else 0.0 for lp in e.logprobs] for e in encoded]
            _, _, _, old = self._collate(encoded, old_values)
            old = old[:, 1:]
        return ids, labels, attention, adv[:, 1:], old

    # --- training ------------------------------------------------------------------------------

    def train_rows(self, rows: list[dict[str, Any]], method: str) -> dict[str, float]:
        """Train `epochs` passes over `rows` with one method; returns metrics (loss of the last pass)."""
        import torch

        if not rows:
            raise TrainerError(f"batch: no rows to train on with method {method!r}")
        size = self.config.micro_batch_size
        micro = [rows[i : i + size] for i in range(0, len(rows), size)]
        tokens, losses, start, extra, first = 0, [], time.perf_counter(), {}, None
        grpo_old = {}
        if method == "grpo":
            grpo_old = {i: self._grpo_old(m) for i, m in enumerate(micro)}
        for _ in range(self.config.epochs):
            losses = []
            for i, chunk in enumerate(micro):
                if method == "sft":
                    loss, n = self._sft_micro(chunk)
                elif method == "dpo":
                    loss, n, extra = self._dpo_micro(chunk)
                elif method == "grpo":
                    loss, n = self._grpo_micro(*grpo_old[i])
                else:
                    raise TrainerError(f"--method: expected sft, dpo or grpo, got {method!r}")
                (loss / self.config.gradient_accumulation_steps).backward()
                tokens += n
                losses.append(float(loss.detach()))
                if (i + 1) % self.config.gradient_accumulation_steps == 0 or i == len(micro) - 1:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                    self.state.step += 1
            first = sum(losses) / len(losses) if first is None else first
        elapsed = time.perf_counter() - start
        return {
            "loss": sum(losses) / len(losses),
            "loss_first_epoch": first,
            "tokens": float(tokens),
            "tokens_per_s": tokens / elapsed,
            **extra,
        }

    def _grpo_old(self, rows):
        import torch

        ids, labels, attention, adv, old = self._grpo_tensors(rows)
        if old is None:
            with torch.no_grad():
                old, _ = token_logprobs(self._logits(ids, attention), labels)
        return ids, labels, attention, adv, old.detach()

    def _grpo_micro(self, ids, labels, attention, adv, old):
        logps, mask = token_logprobs(self._logits(ids, attention), labels)
        ref = None
        if self.config.kl_beta and self.config.lora:
            import torch

            with torch.no_grad(), self.model.disable_adapter():
                ref, _ = token_logprobs(self._logits(ids, attention), labels)
        loss = grpo_loss(logps, old, adv, mask, self.config.clip_epsilon, ref, self.config.kl_beta)
        return loss, int(attention.sum())

    def train_batch(self, rows: list[dict[str, Any]], method: str, batch_id: str) -> PolicyUpdated:
        """Train on one batch, checkpoint, and return the `policy.updated` event to publish."""
        metrics = self.train_rows(rows, method)
        previous = self.state.policy_version
        self.state.policy_version = f"v{len(self.state.batches) + 1}"
        self.state.batches.append(batch_id)
        event = self.policy_event(previous, method, [batch_id], metrics)
        self.state.last_event = json.loads(event.model_dump_json())
        self.save_checkpoint()
        log.info(
            "executor: %s on %s -> %s (loss %.4f)",
            method,
            batch_id,
            self.state.policy_version,
            metrics["loss"],
        )
        return event

    def policy_event(
        self, previous, method: str, batch_ids: list[str], metrics: dict[str, float]
    ) -> PolicyUpdated:
        version = self.state.policy_version
        return PolicyUpdated(
            event_id=derived_event_id("policy.updated", version, *batch_ids),
            trajectory_id=version,
            occurred_at=utc_now(),
            producer="trainer-executor",
            policy_version=version,
            previous_version=previous,
            base_model=self.config.base_model,
            checkpoint_path=str(self.ckpt_root / version),
            method=method,
            step=self.state.step,
            batch_ids=batch_ids,
            metrics=metrics,
        )

    def save_checkpoint(self) -> Path:
        import torch

        path = self.ckpt_root / str(self.state.policy_version)
        path.mkdir(parents=True, exist_ok=True)
        if self.config.lora:
            self.model.save_pretrained(path / "adapter")
        else:
            self.model.save_pretrained(path / "model")
            self.tokenizer.save_pretrained(path / "model")
        tmp = path / "optimizer.pt.tmp"
        torch.save(self.optimizer.state_dict(), tmp)
        os.replace(tmp, path / "optimizer.pt")
        state = asdict(self.state)
        atomic_write(path / "state.json", json.dumps(state, indent=2).encode())
        atomic_write(self.ckpt_root / "latest", path.name.encode())  # the commit point of a checkpoint
        return path

    def logits(self, input_ids: list[int]):
        """Logits of one sequence (eval mode, no grad) — for checks and tests."""
        import torch

        self.model.eval()
        try:
            with torch.no_grad():
                ids = torch.tensor([input_ids], device=self._device())
                return self.model(input_ids=ids).logits[0].float().cpu()
        finally:
            self.model.train()

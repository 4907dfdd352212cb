"""The training executor: SFT, DPO and GRPO steps on batch rows, with LoRA, and a checkpoint plus
a `policy.updated` event per version. torch / transformers / peft are imported inside functions only.

- SFT: token NLL on assistant tokens only (observations and prompts are -100), optionally
  step-weighted (w_s = p_s / mean p; a step without a process score weighs 1, never 0).
- DPO and GRPO's KL (when `kl_beta` > 0) compare with the reference policy (`reference`).
- GRPO: whole groups are admitted by staleness first (`offpolicy.admit_groups`); a batch with
  nothing admitted makes no version (its id is recorded, its dropped groups are counted into the
  next update). The loss is the clipped surrogate on the proximal policy (old logprobs: the
  weights before the update, computed once under no_grad) times the token-level truncated
  importance weight min(exp(old - behaviour), C) against the logprobs recorded at sampling time
  (decoupled PPO; w = 1 where none were recorded or with `--is-correction none`), plus the KL term.
- The learning rate follows `offpolicy.learning_rate_at` per optimizer step from `state.step`.
- bf16 on GPU, fp32 on CPU.
- One base: `--base-model` (AGENTSTREAM_BASE_MODEL, the policy server's setting too). Each
  `policy.updated` names it (`base_model_id`, `tokenizer_hash`: `clients.base_model`), and a
  checkpoint trained on another base is refused at start rather than resumed.

The parts around it: `row_tensors` (rows -> padded tensors), `reference` (the reference policy),
`versions` (the state, the version numbering and the event), `checkpoints` (the files on disk).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from clients.base_model import base_model_id, tokenizer_hash
from consumers.batching.tokenize import Encoded
from consumers.errors import TrainerError
from consumers.training import checkpoints
from consumers.training.config import TrainConfig
from consumers.training.losses import (
    dpo_loss,
    grpo_loss,
    importance_sums,
    sft_loss,
    step_weights,
    tis_weights,
    token_logprobs,
)
from consumers.training.offpolicy import (
    Admission,
    admit_groups,
    epoch_metrics,
    learning_rate_at,
    lineage_fields,
)
from consumers.training.reference import ReferencePolicy
from consumers.training.row_tensors import collate, encode_row
from consumers.training.versions import TrainState, check_same_base, policy_event
from schemas.events import PolicyUpdated

log = logging.getLogger(__name__)


class TrainingExecutor:
    """Owns the model, the optimizer and the checkpoints under `<data_dir>/checkpoints`."""

    def __init__(self, config: TrainConfig, data_dir: str | Path):
        self.config = config
        self.data_dir = Path(data_dir)
        self.ckpt_root = self.data_dir / "checkpoints"
        self.state = TrainState()
        self._warned_versions: set[str] = set()
        if config.is_correction == "none":
            log.warning(
                "executor: off-policy correction disabled (--is-correction none): GRPO trains on "
                "samples from older versions without importance weights"
            )
        self._load()

    # --- model ----------------------------------------------------------------------------------

    def _device(self):
        import torch

        return torch.device(self.config.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    def base_path(self) -> Path:
        if self.config.base_model == "tiny":
            from consumers.tiny_model import tiny_model_dir

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
        base_dir = self.base_path()
        self.tokenizer = AutoTokenizer.from_pretrained(base_dir)
        # The base every version names on policy.updated; the policy server refuses another's.
        self.base_model_id = base_model_id(base_dir)
        self.tokenizer_hash = tokenizer_hash(self.tokenizer, base_dir)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        latest = checkpoints.latest_checkpoint(self.ckpt_root)
        weights = latest / "model" if latest is not None and not self.config.lora else base_dir
        model = AutoModelForCausalLM.from_pretrained(weights, dtype=dtype)
        if self.config.lora:
            model = self._with_adapter(model, latest)
        self.model = model.to(device)
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=self.config.learning_rate, weight_decay=self.config.weight_decay
        )
        if latest is not None:
            checkpoints.load_optimizer(self.optimizer, latest, device)
            self.state = checkpoints.read_state(latest)
            check_same_base(self.state, self.base_model_id, self.tokenizer_hash, latest)
            log.info("executor: resumed %s at step %d", self.state.policy_version, self.state.step)
        self.reference = ReferencePolicy(self.config, self.ckpt_root, base_dir, device)

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

    # --- rows -> tensors -----------------------------------------------------------------------

    def encode_row(self, row: dict[str, Any], completion_key: str | None = None) -> Encoded:
        """A row (pre-tokenized, `messages`, or `prompt` + completion) with this executor's tokenizer."""
        return encode_row(self.tokenizer, row, completion_key)

    def _collate(self, encoded: list[Encoded], *extras: list[list[float]], keep_end: bool = False):
        pad_id, limit = self.tokenizer.pad_token_id, self.config.max_length
        return collate(
            encoded, *extras, pad_id=pad_id, max_length=limit, device=self._device(), keep_end=keep_end
        )

    def _logits(self, ids, attention):
        return self.model(input_ids=ids, attention_mask=attention).logits

    # --- losses per method ---------------------------------------------------------------------

    def _sft_micro(self, rows: list[dict[str, Any]]):
        encoded = [self.encode_row(r) for r in rows]
        weights = None
        if self.config.step_weighted_loss:
            weights = [
                step_weights(e.steps or [-1] * len(e.input_ids), r.get("step_rewards"))
                for e, r in zip(encoded, rows, strict=True)
            ]
        ids, labels, attention, w = self._collate(encoded, *([weights] if weights else []))
        return sft_loss(self._logits(ids, attention), labels, w[0] if w else None), int(attention.sum())

    def _dpo_micro(self, rows: list[dict[str, Any]]):
        import torch

        encoded = [self.encode_row(r, "chosen") for r in rows] + [
            self.encode_row(r, "rejected") for r in rows
        ]
        ids, labels, attention, _ = self._collate(encoded, keep_end=True)
        ref = self.reference.token_logps(self.model, ids, labels, attention).sum(-1)
        policy = token_logprobs(self._logits(ids, attention), labels)[0].sum(-1)
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
        behaviour = [[math.nan if lp is None else lp for lp in e.logprobs] for e in encoded]
        ids, labels, attention, (adv, lps) = self._collate(encoded, advantages, behaviour)
        return ids, labels, attention, adv[:, 1:], lps[:, 1:]  # aligned with token_logprobs

    # --- training ------------------------------------------------------------------------------

    def train_rows(self, rows: list[dict[str, Any]], method: str) -> dict[str, float]:
        """Train `epochs` passes over `rows` with one method; returns metrics (loss of the last pass;
        for GRPO the importance-weight, clip and KL figures too)."""
        if method not in ("sft", "dpo", "grpo"):
            raise TrainerError(f"--method: expected sft, dpo or grpo, got {method!r}")
        if not rows:
            raise TrainerError(f"batch: no rows to train on with method {method!r}")
        size = self.config.micro_batch_size
        micro = [rows[i : i + size] for i in range(0, len(rows), size)]
        start, first, tokens = time.perf_counter(), None, 0
        prepared, is_parts = [], []
        if method == "grpo":
            prepared, is_parts = zip(*(self._grpo_prepare(m) for m in micro), strict=True)
        for _ in range(self.config.epochs):
            losses, sums, steps = [], {}, []
            for i, chunk in enumerate(micro):
                loss, n, extra = self._micro_loss(method, chunk, prepared[i] if prepared else None)
                (loss / self.config.gradient_accumulation_steps).backward()
                tokens += n
                losses.append(float(loss.detach()))
                for key, value in extra.items():
                    sums[key] = sums.get(key, 0.0) + value
                if (i + 1) % self.config.gradient_accumulation_steps == 0 or i == len(micro) - 1:
                    steps.append(self._optimizer_step())
            first = sum(losses) / len(losses) if first is None else first
        elapsed = time.perf_counter() - start
        return {
            "loss": sum(losses) / len(losses),
            "loss_first_epoch": first,
            "tokens": float(tokens),
            "tokens_per_s": tokens / elapsed,
            "lr": steps[-1][0],
            "grad_norm": sum(g for _, g in steps) / len(steps),
            **epoch_metrics(method, sums, is_parts),
        }

    def _micro_loss(self, method: str, chunk: list[dict[str, Any]], prepared):
        if method == "sft":
            return (*self._sft_micro(chunk), {})
        if method == "dpo":
            loss, n, extra = self._dpo_micro(chunk)
            return loss, n, {"reward_margin": extra["reward_margin"], "pairs": 1.0}
        return self._grpo_micro(*prepared)

    def _optimizer_step(self) -> tuple[float, float]:
        """Clip, set this step's learning rate, step; returns (lr, grad norm before clipping)."""
        import torch

        c = self.config
        lr = learning_rate_at(
            self.state.step, c.learning_rate, c.warmup_steps, c.lr_schedule, c.schedule_steps, c.min_lr_ratio
        )
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        return lr, float(norm)

    def _grpo_prepare(self, rows):
        """A micro batch's tensors and what stays fixed over the epochs: old logprobs (the weights
        before the update, no_grad), the TIS weights, the reference logprobs; plus IS statistics."""
        import torch

        ids, labels, attention, adv, behaviour = self._grpo_tensors(rows)
        with torch.no_grad():
            old, mask = token_logprobs(self._logits(ids, attention), labels)
        has = mask & ~torch.isnan(behaviour)
        truncation = self.config.is_truncation if self.config.is_correction == "tis" else None
        weight, ratio = tis_weights(old, torch.nan_to_num(behaviour), has, truncation)
        ref = self.reference.token_logps(self.model, ids, labels, attention) if self.config.kl_beta else None
        stats = importance_sums(ratio, weight, has, truncation)
        return (ids, labels, attention, adv, old.detach(), weight, ref), stats

    def _grpo_micro(self, ids, labels, attention, adv, old, weight, ref):
        logps, mask = token_logprobs(self._logits(ids, attention), labels)
        loss, stats = grpo_loss(
            logps, old, adv, mask, self.config.clip_epsilon, ref, self.config.kl_beta, weight
        )
        extra = {
            "trainable": float(mask.sum()),
            "clipped": float(stats["clipped"].sum()),
            "kl": float(stats["kl"].sum()),
        }
        return loss, int(attention.sum()), extra

    def _admit(self, rows: list[dict[str, Any]]) -> Admission:
        admission = admit_groups(rows, self.state.policy_version, self.config.max_staleness)
        for version in set(admission.unknown_versions) - self._warned_versions:
            self._warned_versions.add(version)
            log.warning("executor: behaviour version %r has no number: its groups are dropped", version)
        return admission

    def train_batch(
        self, rows: list[dict[str, Any]], method: str, batch_id: str, *, source_ranges: dict | None = None
    ) -> PolicyUpdated | None:
        """Train on one batch, checkpoint, and return the `policy.updated` event to publish; None
        (no version) when GRPO admitted no group (all too stale): the batch is recorded as done."""
        admission = self._admit(rows) if method == "grpo" else None
        if admission is not None and not admission.rows:
            return self._drop_batch(batch_id, admission)
        metrics = self.train_rows(admission.rows if admission else rows, method)
        dropped = (admission.dropped_groups if admission else 0) + self.state.pending_dropped
        metrics["dropped_groups"] = float(dropped)
        metrics["trained_groups"] = float(admission.trained_groups if admission else 0)
        previous = self.state.next_version(batch_id)
        lineage = lineage_fields(admission.rows if admission else rows, admission)
        lineage |= {"source_ranges": source_ranges or {}, "dropped_groups": dropped}
        event = policy_event(
            self.state,
            self.config.base_model,
            self.ckpt_root,
            previous,
            method,
            [batch_id],
            metrics,
            base_model_id=self.base_model_id,
            tokenizer_hash=self.tokenizer_hash,
            **lineage,
        )
        self.state.last_event = json.loads(event.model_dump_json())
        checkpoints.save_checkpoint(
            self.ckpt_root, self.state, self.model, self.tokenizer, self.optimizer, self.config.lora
        )
        log.info(
            "executor: %s on %s -> %s (loss %.4f, %d groups dropped)",
            method, batch_id, self.state.policy_version, metrics["loss"], dropped,
        )  # fmt: skip
        return event

    def _drop_batch(self, batch_id: str, admission: Admission) -> None:
        self.state.drop_batch(batch_id, admission.dropped_groups)
        checkpoints.save_state(self.ckpt_root, self.state)
        log.warning(
            "executor: %s: all %d groups over --max-staleness %d behind %s; dropped, no new version",
            batch_id, admission.dropped_groups, self.config.max_staleness, self.state.policy_version,
        )  # fmt: skip

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

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
- bf16 on GPU, fp32 on CPU. `--gradient-checkpointing` recomputes activations in the backward
  pass (less memory, more compute; non-reentrant, so LoRA needs no input-grad hook).
- No silent truncation: a row (or a DPO pair with either side) longer than `--max-length` is left
  out of the update and counted (`rows_over_max_length`, `tokens_over_max_length`: the tokens of
  the rows left out, every side of a pair); a batch with every row over is a TrainerError.
- Gradient accumulation: an optimizer step's gradient is the mean over its micro batches (each
  micro batch's loss is a mean over its tokens); the last, partial step divides by the micro
  batches it really has.
- A group of ranks (`ranks`, `distributed.join_group`): each optimizer step holds
  `gradient_accumulation_steps * world_size` micro batches and every rank trains its share
  (`distributed.plan_steps`), so its gradient is the mean over all of them: N ranks with
  accumulation a equal one process with a * N (fp32; the test holds them within 1e-5). LoRA
  trains through DDP, a full fine-tune through FSDP2 (`fully_shard` per decoder layer; it runs on
  CPU with gloo). Metrics are summed across ranks and are the same on every rank, and so is the
  event (rank 0's, broadcast). Only rank 0 writes checkpoints (FSDP: the full state dict gathered
  on rank 0); every rank resumes from the same checkpoint directory, so a group runs on one
  machine or over a checkpoint directory every rank can read.
- One base: `--base-model` (AGENTSTREAM_BASE_MODEL, the policy server's setting too). Each
  `policy.updated` names it (`base_model_id`, `tokenizer_hash`: `clients.base_model`), and a
  checkpoint trained on another base is refused at start rather than resumed.
- A version the evaluation gate refused is not trained on: `restore` goes back to the serving
  version's checkpoint (or the base), at once and when starting (`gate`, `checkpoints.roll_back`).

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
from consumers.training import checkpoints, distributed
from consumers.training.config import TrainConfig
from consumers.training.distributed import Ranks, plan_steps
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
from consumers.training.row_tensors import Fit, collate, encode_row, fit_rows
from consumers.training.versions import TrainState, check_same_base, policy_event
from schemas.events import PolicyUpdated

log = logging.getLogger(__name__)


_SUMS = {"sft": (), "dpo": ("reward_margin", "pairs"), "grpo": ("trainable", "clipped", "kl")}
_IS_SUMS = ("n", "ratio_sum", "w_sum", "w_sq", "truncated")


class TrainingExecutor:
    """Owns the model, the optimizer and the checkpoints under `<data_dir>/checkpoints`; one rank
    of a group when `ranks` says so (the group joined already: `distributed.join_group`)."""

    def __init__(self, config: TrainConfig, data_dir: str | Path, ranks: Ranks | None = None):
        self.config = config
        self.data_dir = Path(data_dir)
        self.ckpt_root = self.data_dir / "checkpoints"
        self.ranks = ranks or Ranks()
        self.state = TrainState()
        self._warned_versions: set[str] = set()
        if config.is_correction == "none" and self.ranks.is_main:
            log.warning(
                "executor: off-policy correction disabled (--is-correction none): GRPO trains on "
                "samples from older versions without importance weights"
            )
        self._load()

    # --- model ----------------------------------------------------------------------------------

    def _device(self):
        import torch

        device = torch.device(self.config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.type == "cuda" and self.ranks.distributed:
            return torch.device("cuda", self.ranks.local_rank)
        return device

    @property
    def _sharded(self) -> bool:
        return self.ranks.distributed and not self.config.lora

    def base_path(self) -> Path:
        if self.config.base_model == "tiny":
            from consumers.tiny_model import tiny_model_dir

            # rank 0 builds it first: once a group is joined, transformers saves weights on rank 0 only
            built = tiny_model_dir(self.data_dir) if self.ranks.is_main else None
            distributed.barrier(self.ranks)
            return built or tiny_model_dir(self.data_dir)
        path = Path(self.config.base_model)
        if not path.exists():
            raise TrainerError(
                f"--base-model: {self.config.base_model!r} is not a local directory (or 'tiny')"
            )
        return path

    def _load(self) -> None:
        """Long: tokenizer, model (base or resumed; adapter; checkpointing; DDP/FSDP), optimizer
        and state from the latest checkpoint (rolled back first when the gate refused it: `gate`),
        then the reference policy; the same on every rank."""
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
        if self.ranks.is_main and (back := checkpoints.roll_back_refused(self.ckpt_root)) is not None:
            log.warning("executor: the latest version was refused by the gate; resuming from %s", back)
        distributed.barrier(self.ranks)  # every rank reads `latest` after rank 0's roll-back
        latest = checkpoints.latest_checkpoint(self.ckpt_root)
        state = checkpoints.read_state(latest) if latest is not None else None
        source = latest if state is not None and state.policy_version is not None else None  # else base
        weights = source / "model" if source is not None and not self.config.lora else base_dir
        model = AutoModelForCausalLM.from_pretrained(weights, dtype=dtype)
        if self.config.gradient_checkpointing:
            model.config.use_cache = False
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.config.lora:
            model = self._with_adapter(model, source)
        self.model = model.to(device)
        self.model.train()
        # The module forward passes with gradients go through (DDP around the model, or the model).
        self.trained = distributed.wrap_model(self.model, self.ranks, sharded=self._sharded, device=device)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=self.config.learning_rate, weight_decay=self.config.weight_decay
        )
        if source is not None:
            names = [n for n, p in self.model.named_parameters() if p.requires_grad]
            full = (
                (lambda st: distributed.load_full_optimizer(self.model, self.optimizer, st))
                if self._sharded
                else None
            )
            checkpoints.load_optimizer(self.optimizer, source, device, names, load_full=full)
        if state is not None:
            self.state = state
            check_same_base(self.state, self.base_model_id, self.tokenizer_hash, latest)
            log.info("executor: resumed %s at step %d", self.state.policy_version, self.state.step)
        self.reference = ReferencePolicy(self.config, self.ckpt_root, base_dir, device)

    def restore(self, version: str) -> None:
        """Go back to `version`'s weights ("base": the base model, a fresh adapter and optimizer) after
        the evaluation gate refused the version trained last: its checkpoint becomes the one `latest`
        names (`checkpoints.roll_back`); the version counter and the batches trained go on. Every rank
        of a group calls it (the model is rebuilt as when resuming)."""
        if self.ranks.is_main:
            checkpoints.roll_back(self.ckpt_root, self.state, version)
        distributed.barrier(self.ranks)
        self.model = self.trained = self.optimizer = self.reference = None  # freed before reloading
        self._load()

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

    def _encode(self, row: dict[str, Any], method: str) -> tuple[Encoded, ...]:
        if method == "dpo":
            return self.encode_row(row, "chosen"), self.encode_row(row, "rejected")
        return (self.encode_row(row),)

    def _collate(self, encoded: list[Encoded], *extras: list[list[float]]):
        pad_id, limit = self.tokenizer.pad_token_id, self.config.max_length
        return collate(encoded, *extras, pad_id=pad_id, max_length=limit, device=self._device())

    def _logits(self, ids, attention, *, grad: bool = True):
        """Logits through the trained module (DDP/FSDP: the gradient is synchronised) or, without
        gradients, through the model itself (FSDP: the same module, its passes line up by plan)."""
        module = self.trained if grad else self.model
        return module(input_ids=ids, attention_mask=attention).logits

    # --- losses per method ---------------------------------------------------------------------

    def _sft_micro(self, rows: list[dict[str, Any]], encoded: list[tuple[Encoded, ...]]):
        encoded = [e for (e,) in encoded]
        weights = None
        if self.config.step_weighted_loss:
            weights = [
                step_weights(e.steps or [-1] * len(e.input_ids), r.get("step_rewards"))
                for e, r in zip(encoded, rows, strict=True)
            ]
        ids, labels, attention, w = self._collate(encoded, *([weights] if weights else []))
        return sft_loss(self._logits(ids, attention), labels, w[0] if w else None), int(attention.sum())

    def _dpo_micro(self, rows: list[dict[str, Any]], pairs: list[tuple[Encoded, ...]]):
        import torch

        encoded = [c for c, _ in pairs] + [r for _, r in pairs]
        ids, labels, attention, _ = self._collate(encoded)
        ref = self.reference.token_logps(self.model, ids, labels, attention).sum(-1)
        policy = token_logprobs(self._logits(ids, attention), labels)[0].sum(-1)
        n = len(rows)
        loss = dpo_loss(policy[:n], policy[n:], ref[:n], ref[n:], self.config.beta)
        with torch.no_grad():
            margin = ((policy[:n] - ref[:n]) - (policy[n:] - ref[n:])).mean().item()
        return loss, int(attention.sum()), {"reward_margin": margin}

    def _grpo_tensors(self, rows: list[dict[str, Any]], encoded: list[tuple[Encoded, ...]] | None = None):
        encoded = [e for (e,) in encoded] if encoded is not None else [self.encode_row(r) for r in rows]
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

    def _fit(self, rows: list[dict[str, Any]], method: str, batch_id: str):
        """The rows that fit `--max-length` with their encodings, and what was left out."""
        encoded = [self._encode(r, method) for r in rows]
        fit = fit_rows([tuple(len(e.input_ids) for e in sides) for sides in encoded], self.config.max_length)
        if not fit.kept:
            raise TrainerError(
                f"--max-length: every one of the {len(rows)} rows of batch {batch_id} is over "
                f"--max-length {self.config.max_length} (the longest has {fit.longest} tokens); "
                "raise --max-length or build shorter rows"
            )
        if fit.rows_over and self.ranks.is_main:
            log.warning(
                "executor: batch %s: %d of %d rows over --max-length %d (longest %d tokens, %d tokens in "
                "all) left out of the update",
                batch_id, fit.rows_over, len(rows), self.config.max_length, fit.longest, fit.tokens_over,
            )  # fmt: skip
        return [rows[i] for i in fit.kept], [encoded[i] for i in fit.kept], fit

    def train_rows(self, rows: list[dict[str, Any]], method: str, batch_id: str = "rows") -> dict[str, float]:
        """Long: train `epochs` passes over `rows` with one method (this rank's share of each
        optimizer step, see the module docstring); returns metrics summed over ranks, the same on
        every rank (loss of the last pass; GRPO's importance-weight, clip and KL figures; the rows
        left out for `--max-length`)."""
        if method not in ("sft", "dpo", "grpo"):
            raise TrainerError(f"--method: expected sft, dpo or grpo, got {method!r}")
        if not rows:
            raise TrainerError(f"batch: no rows to train on with method {method!r}")
        rows, encoded, fit = self._fit(rows, method, batch_id)
        size = self.config.micro_batch_size
        micro = [(rows[i : i + size], encoded[i : i + size]) for i in range(0, len(rows), size)]
        plan = plan_steps(len(micro), self.config.gradient_accumulation_steps, self.ranks)
        slots = [(i, n) for mine, n in plan for i in mine]  # None: a zero-weight pass (micro batch 0)
        start = time.perf_counter()
        prepared, is_parts = [], []
        if method == "grpo":
            for i, _ in slots:
                tensors, stats = self._grpo_prepare(*micro[0 if i is None else i])
                prepared.append(tensors)
                is_parts += [stats] if i is not None else []
        local = {"tokens": 0.0, "first_loss": 0.0, "micros": 0.0}
        for epoch in range(self.config.epochs):
            local |= {"loss": 0.0} | {k: 0.0 for k in _SUMS[method]}
            steps = []  # (lr, grad norm) of the last epoch's optimizer steps
            k = 0
            for mine, n in plan:
                for j, i in enumerate(mine):
                    chunk = micro[0 if i is None else i]
                    with distributed.gradient_sync(self.trained, sync=j == len(mine) - 1):
                        loss, tokens, extra = self._micro_loss(
                            method, chunk, prepared[k] if prepared else None
                        )
                        scale = 0.0 if i is None else self.ranks.world_size / n
                        (loss * scale).backward()
                    k += 1
                    if i is None:
                        continue
                    local["tokens"] += tokens
                    local["loss"] += float(loss.detach())
                    local["micros"] += 1.0 if epoch == 0 else 0.0
                    for key, value in extra.items():
                        local[key] += value
                steps.append(self._optimizer_step())
            if epoch == 0:
                local["first_loss"] = local["loss"]
        return self._metrics(method, local, is_parts, steps, time.perf_counter() - start, fit)

    def _metrics(self, method, local, is_parts, steps, elapsed, fit: Fit) -> dict[str, float]:
        """This rank's sums summed over ranks (`all_sum`): the same figures on every rank."""
        for key in _IS_SUMS:
            local[f"is_{key}"] = sum(p[key] for p in is_parts)
        total = distributed.all_sum(self.ranks, local)
        most = distributed.all_max(
            self.ranks,
            {"elapsed": elapsed, "ratio_max": max((p["ratio_max"] for p in is_parts if p["n"]), default=0.0)},
        )
        part = {key: total[f"is_{key}"] for key in _IS_SUMS} | {"ratio_max": most["ratio_max"]}
        micros = total["micros"]
        return {
            "loss": total["loss"] / micros,
            "loss_first_epoch": total["first_loss"] / micros,
            "tokens": total["tokens"],
            "tokens_per_s": total["tokens"] / max(most["elapsed"], 1e-9),
            "lr": steps[-1][0],
            "grad_norm": sum(g for _, g in steps) / len(steps),
            "rows_over_max_length": float(fit.rows_over),
            "tokens_over_max_length": float(fit.tokens_over),
            **epoch_metrics(method, total, [part] if method == "grpo" else []),
        }

    def _micro_loss(self, method: str, chunk, prepared):
        rows, encoded = chunk
        if method == "sft":
            return (*self._sft_micro(rows, encoded), {})
        if method == "dpo":
            loss, n, extra = self._dpo_micro(rows, encoded)
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
        return lr, distributed.scalar(norm)

    def _grpo_prepare(self, rows, encoded=None):
        """A micro batch's tensors and what stays fixed over the epochs: old logprobs (the weights
        before the update, no_grad), the TIS weights, the reference logprobs; plus IS statistics."""
        import torch

        ids, labels, attention, adv, behaviour = self._grpo_tensors(rows, encoded)
        with torch.no_grad():
            old, mask = token_logprobs(self._logits(ids, attention, grad=False), labels)
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
            if self.ranks.is_main:
                log.warning("executor: behaviour version %r has no number: its groups are dropped", version)
        return admission

    def train_batch(
        self, rows: list[dict[str, Any]], method: str, batch_id: str, *, source_ranges: dict | None = None
    ) -> PolicyUpdated | None:
        """Train on one batch, checkpoint, and return the `policy.updated` event to publish; None
        (no version) when GRPO admitted no group (all too stale): the batch is recorded as done.
        In a group every rank calls it with the same batch and gets the same event."""
        admission = self._admit(rows) if method == "grpo" else None
        if admission is not None and not admission.rows:
            return self._drop_batch(batch_id, admission)
        metrics = self.train_rows(admission.rows if admission else rows, method, batch_id)
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
        event = distributed.broadcast_object(self.ranks, event)  # one event (its time) on every rank
        self.state.last_event = json.loads(event.model_dump_json())
        self._save()
        if self.ranks.is_main:
            log.info(
                "executor: %s on %s -> %s (loss %.4f, %d groups dropped)",
                method, batch_id, self.state.policy_version, metrics["loss"], dropped,
            )  # fmt: skip
        return event

    def _save(self) -> None:
        """Rank 0 writes the checkpoint (FSDP: the full state gathered by every rank first); every
        rank returns once it is committed."""
        model_state, optimizer_state = distributed.full_state(
            self.model, self.optimizer, self.ranks, sharded=self._sharded
        )
        if self.ranks.is_main:
            checkpoints.save_checkpoint(
                self.ckpt_root, self.state, self.model, self.tokenizer, self.optimizer, self.config.lora,
                model_state=model_state, optimizer_state=optimizer_state,
            )  # fmt: skip
        distributed.barrier(self.ranks)

    def _drop_batch(self, batch_id: str, admission: Admission) -> None:
        self.state.drop_batch(batch_id, admission.dropped_groups)
        if self.ranks.is_main:
            checkpoints.save_state(self.ckpt_root, self.state)
            log.warning(
                "executor: %s: all %d groups over --max-staleness %d behind %s; dropped, no new version",
                batch_id, admission.dropped_groups, self.config.max_staleness, self.state.policy_version,
            )  # fmt: skip
        distributed.barrier(self.ranks)

    def logits(self, input_ids: list[int]):
        """Logits of one sequence (eval mode, no grad) — for checks and tests (FSDP: a collective,
        every rank calls it)."""
        import torch

        self.model.eval()
        try:
            with torch.no_grad():
                ids = torch.tensor([input_ids], device=self._device())
                return self.model(input_ids=ids).logits[0].float().cpu()
        finally:
            self.model.train()

"""The reference policy of DPO and of GRPO's KL term (`--reference`).

`base` is the model before any update: with LoRA, the trained model with its adapter disabled; in
full fine-tuning, a frozen model loaded once from the base weights (never from a resumed
checkpoint). `vN` loads that version's checkpoint (adapter merged, or full model) into a separate
frozen model. torch / transformers / peft are imported inside functions only.
"""

from __future__ import annotations

from pathlib import Path

from consumers.training.checkpoints import reference_dir
from consumers.training.config import TrainConfig
from consumers.training.losses import token_logprobs


class ReferencePolicy:
    """Per-token logprobs under the reference; its model is loaded on first use."""

    def __init__(self, config: TrainConfig, ckpt_root: Path, base_dir: Path, device):
        self.config, self.base_dir, self.device = config, base_dir, device
        self.dir = reference_dir(ckpt_root, config.reference)  # fails at start on a missing version
        self._model = None

    def model(self):
        """The frozen reference model, loaded once: base weights from disk, or a named version."""
        if self._model is None:
            import torch
            from transformers import AutoModelForCausalLM

            path = self.dir
            source = path if path is not None and path.name == "model" else self.base_dir
            dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
            if path is not None and path.name == "adapter":
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, path).merge_and_unload()
            self._model = model.to(self.device).eval().requires_grad_(False)
        return self._model

    def token_logps(self, policy, ids, labels, attention):
        """Per-token logprobs under the reference, no grad ([batch, seq-1], 0 off the labels);
        `policy` is the model being trained (its adapter disabled is the LoRA base reference)."""
        import torch

        with torch.no_grad():
            if self.config.lora and self.config.reference == "base":
                with policy.disable_adapter():
                    return token_logprobs(_logits(policy, ids, attention), labels)[0]
            return token_logprobs(_logits(self.model(), ids, attention), labels)[0]


def _logits(model, ids, attention):
    return model(input_ids=ids, attention_mask=attention).logits

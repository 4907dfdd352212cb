"""Loss functions of the executor, on tensors (torch is imported by the caller's process only).

Conventions: `labels` are -100 outside trainable tokens; logits and labels are shifted by one token
inside these functions, so callers pass the model's logits and the row's labels as they are.
"""

from __future__ import annotations

from typing import Any

IGNORE_INDEX = -100


def token_logprobs(logits: Any, labels: Any) -> tuple[Any, Any]:
    """Per-token log p(label) and the trainable mask, both shaped [batch, seq-1]."""
    import torch

    shifted_logits = logits[:, :-1, :].float()
    targets = labels[:, 1:]
    mask = targets != IGNORE_INDEX
    safe = torch.where(mask, targets, torch.zeros_like(targets))
    logps = torch.log_softmax(shifted_logits, dim=-1).gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    return logps * mask, mask


def sft_loss(logits: Any, labels: Any, weights: Any | None = None) -> Any:
    """Token NLL averaged over trainable tokens; with `weights` ([batch, seq], aligned to labels),
    sum(w * nll) / sum(w * mask) (step-weighted loss)."""
    logps, mask = token_logprobs(logits, labels)
    w = mask.float() if weights is None else weights[:, 1:].float() * mask
    return -(logps * w).sum() / w.sum().clamp(min=1e-8)


def sequence_logps(logits: Any, labels: Any) -> Any:
    """Sum of trainable-token log-probabilities per row."""
    logps, _ = token_logprobs(logits, labels)
    return logps.sum(-1)


def dpo_loss(
    policy_chosen: Any, policy_rejected: Any, ref_chosen: Any, ref_rejected: Any, beta: float
) -> Any:
    """-log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))), averaged over pairs."""
    import torch.nn.functional as F

    logits = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * logits).mean()


def grpo_loss(
    logps: Any,
    old_logps: Any,
    advantages: Any,
    mask: Any,
    clip_epsilon: float,
    ref_logps: Any = None,
    kl_beta=0.0,
) -> Any:
    """Clipped surrogate with per-token advantages, averaged over trainable tokens (token-mean).

    L = -sum(mask * min(rho * A, clip(rho, 1-eps, 1+eps) * A)) / sum(mask), rho = exp(logp - old);
    plus kl_beta * k3(ref || policy) on the same tokens when a reference is given.
    """
    import torch

    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - clip_epsilon, 1 + clip_epsilon)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)
    per_token = -surrogate
    if ref_logps is not None and kl_beta:
        delta = ref_logps - logps
        per_token = per_token + kl_beta * (torch.exp(delta) - delta - 1)
    mask = mask.float()
    return (per_token * mask).sum() / mask.sum().clamp(min=1e-8)

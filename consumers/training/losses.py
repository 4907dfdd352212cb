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


def tis_weights(old_logps: Any, behaviour_logps: Any, has_behaviour: Any, truncation: float | None) -> tuple:
    """Token-level truncated importance weights and the untruncated ratios, both [batch, seq-1].

    ratio = exp(old - behaviour) where a behaviour logprob exists (`has_behaviour`), else 1;
    weight = min(ratio, truncation), or 1 everywhere when `truncation` is None (no correction).
    Both are detached: the weight scales the gradient, it is not differentiated.
    """
    import torch

    delta = torch.where(has_behaviour, old_logps.detach() - behaviour_logps, torch.zeros_like(old_logps))
    ratio = torch.exp(delta)
    weight = torch.ones_like(ratio) if truncation is None else torch.clamp(ratio, max=truncation)
    return weight, ratio


def grpo_loss(
    logps: Any,
    old_logps: Any,
    advantages: Any,
    mask: Any,
    clip_epsilon: float,
    ref_logps: Any = None,
    kl_beta: float = 0.0,
    is_weights: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """Clipped surrogate with per-token advantages and TIS weights, averaged over trainable tokens.

    L = sum(mask * (-w * min(rho * A, clip(rho, 1-eps, 1+eps) * A) + kl_beta * k3)) / sum(mask),
    rho = exp(logp - old) (the clip is on the proximal policy, decoupled PPO), w the detached
    importance weight old/behaviour (1 when `is_weights` is None), k3 = exp(d) - d - 1 with
    d = ref - logp, when a reference is given. Returns (loss, stats): `clipped` (tokens where the
    clip is active) and `kl` (k3 per token, zeros without a reference), both detached.
    """
    import torch

    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - clip_epsilon, 1 + clip_epsilon)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)
    per_token = -surrogate if is_weights is None else -is_weights * surrogate
    kl = torch.zeros_like(logps)
    if ref_logps is not None:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        if kl_beta:
            per_token = per_token + kl_beta * kl
    mask = mask.float()
    loss = (per_token * mask).sum() / mask.sum().clamp(min=1e-8)
    active = clipped * advantages < ratio * advantages  # min() took the clipped term
    return loss, {"clipped": (active.float() * mask).detach(), "kl": (kl * mask).detach()}


def importance_sums(ratio: Any, weight: Any, has: Any, truncation: float | None) -> dict[str, float]:
    """Sums over the tokens with a behaviour logprob (`has`) that `offpolicy.importance_metrics`
    turns into is_ratio_mean / is_ratio_max / ess / is_truncated_fraction across micro batches."""
    present = ratio[has]
    return {
        "n": float(has.sum()),
        "ratio_sum": float(present.sum()),
        "ratio_max": float(present.max()) if present.numel() else 1.0,
        "w_sum": float(weight[has].sum()),
        "w_sq": float((weight[has] ** 2).sum()),
        "truncated": float((present > truncation).sum()) if truncation else 0.0,
    }

"""Off-policy maths of the GRPO executor, on plain values: the staleness admission of whole groups,
truncated importance weights, effective sample size and the learning rate schedule. No torch here
(the tensor twins live in `losses.py`); nothing here does I/O.

- Versions are numbered by `schemas.policy_versions` (`base` is 0, `vN` is N); a row without a
  version was sampled by `base`. Lags are `consumers.batching.builders.common.policy_lag`, the one
  the GRPO builder's `max_policy_lag` uses too.
- Staleness of a group = P - (oldest behaviour version number among its rows), P the version of the
  weights being trained (`base` before any update). A group is admitted whole iff staleness <=
  max_staleness, never in part. A group with a version whose lag cannot be measured (no number,
  e.g. `nightly`) is dropped whole: it cannot be shown to be within the bound.
- TIS (truncated importance sampling, token level): w = min(exp(logp_old - logp_behaviour), C).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from consumers.batching.builders.common import policy_lag


def behaviour_version(row: dict[str, Any]) -> str | None:
    """The version that sampled a row: `behaviour_version` on token rows, else `policy_version`."""
    return row["behaviour_version"] if "behaviour_version" in row else row.get("policy_version")


@dataclass
class Admission:
    """The rows of the groups admitted, and what was counted on the way."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    trained_groups: int = 0
    dropped_groups: int = 0
    staleness_histogram: dict[str, int] = field(default_factory=dict)
    behaviour_versions: list[str] = field(default_factory=list)
    unknown_versions: list[str] = field(default_factory=list)


def _groups(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rows by `group_id` in first-seen order; a row without one is a group of its own."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(row.get("group_id") or ("row", i), []).append(row)
    return list(groups.values())


def group_staleness(group: list[dict[str, Any]], current: str | None) -> tuple[int | None, list[str]]:
    """(staleness, unknown versions): the largest lag of a row's behaviour version behind `current`;
    None when some row's lag cannot be measured (those versions are the second item).

    >>> group_staleness([{"behaviour_version": "v1"}, {"policy_version": "v3"}], current="v4")
    (3, [])
    >>> group_staleness([{"policy_version": "nightly"}, {"policy_version": "v3"}], current="v4")
    (None, ['nightly'])
    """
    lags, unknown = [], []
    for row in group:
        version = behaviour_version(row)
        lag = policy_lag(version, current)
        if lag is None:
            unknown.append(str(version))
        lags.append(lag)
    return (None if unknown else max(lags)), unknown


def admit_groups(rows: list[dict[str, Any]], current: str | None, max_staleness: int) -> Admission:
    """Admit whole groups sampled at most `max_staleness` versions before `current`; a group whose
    staleness cannot be measured is dropped (its versions are `unknown_versions`).

    >>> rows = [{"group_id": "a", "policy_version": "v1"}, {"group_id": "a", "policy_version": "v3"},
    ...         {"group_id": "b", "policy_version": "v2"}]
    >>> out = admit_groups(rows, "v4", max_staleness=2)
    >>> len(out.rows), out.dropped_groups, out.staleness_histogram, out.behaviour_versions
    (1, 1, {'2': 1}, ['v2'])
    """
    out, histogram, versions, unknown = Admission(), Counter(), set(), set()
    for group in _groups(rows):
        staleness, strange = group_staleness(group, current)
        unknown.update(strange)
        if staleness is None or staleness > max_staleness:
            out.dropped_groups += 1
            continue
        out.trained_groups += 1
        out.rows.extend(group)
        histogram[str(staleness)] += 1
        versions.update(behaviour_version(r) or "base" for r in group)
    out.staleness_histogram = dict(sorted(histogram.items(), key=lambda kv: int(kv[0])))
    out.behaviour_versions = sorted(versions)
    out.unknown_versions = sorted(unknown)
    return out


def truncated_weight(logp_old: float, logp_behaviour: float | None, truncation: float) -> float:
    """One token's TIS weight: min(exp(old - behaviour), C); 1 without a behaviour logprob.

    >>> truncated_weight(-1.0, -2.0, 2.0), round(truncated_weight(-1.0, -0.5, 2.0), 6)
    (2.0, 0.606531)
    """
    if logp_behaviour is None:
        return 1.0
    return min(math.exp(logp_old - logp_behaviour), truncation)


def effective_sample_size(weights: list[float]) -> float:
    """Normalised ESS (sum w)^2 / (n * sum w^2), in (0, 1]; 1.0 for no weights.

    >>> effective_sample_size([1.0, 1.0]), effective_sample_size([2.0, 0.0])
    (1.0, 0.5)
    """
    squares = sum(w * w for w in weights)
    if not weights or squares == 0:
        return 1.0
    return sum(weights) ** 2 / (len(weights) * squares)


def learning_rate_at(
    step: int, base: float, warmup: int, schedule: str, period: int, min_ratio: float
) -> float:
    """The learning rate of optimizer step `step` (0-based): linear warmup over `warmup` steps,
    then constant or cosine from `base` down to `base * min_ratio` over `period` steps (then flat).

    >>> [round(learning_rate_at(s, 1.0, 2, "cosine", 4, 0.1), 4) for s in range(7)]
    [0.5, 1.0, 1.0, 0.8682, 0.55, 0.2318, 0.1]
    >>> learning_rate_at(0, 1.0, 0, "constant", 4, 0.1)
    1.0
    """
    if step < warmup:
        return base * (step + 1) / warmup
    if schedule == "constant":
        return base
    progress = min(1.0, (step - warmup) / max(1, period))
    return base * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def epoch_metrics(method: str, sums: dict[str, float], is_parts) -> dict[str, float]:
    """The last epoch's per-method figures (token means for GRPO) and the IS statistics."""
    if method == "dpo":
        return {"reward_margin": sums["reward_margin"] / sums["pairs"]}
    if method != "grpo":
        return {}
    trainable = max(sums["trainable"], 1.0)
    return {
        "clipped_fraction": sums["clipped"] / trainable,
        "kl": sums["kl"] / trainable,
        **importance_metrics(list(is_parts)),
    }


def importance_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """is_ratio_mean / is_ratio_max (untruncated), ess (normalised, of the weights applied) and
    is_truncated_fraction over the tokens with a behaviour logprob; neutral values without any.

    >>> importance_metrics([{"n": 2, "ratio_sum": 5.0, "ratio_max": 4.0, "w_sum": 3.0, "w_sq": 5.0,
    ...                      "truncated": 1}])["ess"]
    0.9
    """
    n = sum(p["n"] for p in parts)
    if not n:
        return {"is_ratio_mean": 1.0, "is_ratio_max": 1.0, "ess": 1.0, "is_truncated_fraction": 0.0}
    w_sum, w_sq = sum(p["w_sum"] for p in parts), sum(p["w_sq"] for p in parts)
    return {
        "is_ratio_mean": sum(p["ratio_sum"] for p in parts) / n,
        "is_ratio_max": max(p["ratio_max"] for p in parts if p["n"]),
        "ess": w_sum**2 / (n * w_sq) if w_sq else 1.0,
        "is_truncated_fraction": sum(p["truncated"] for p in parts) / n,
    }


def lineage_fields(rows: list[dict[str, Any]], admission: Admission | None) -> dict[str, Any]:
    """Trajectories and behaviour versions a version was trained on (PolicyUpdated's lineage)."""
    keys = ("trajectory_id", "chosen_trajectory_id", "rejected_trajectory_id")
    ids = sorted({r[k] for r in rows for k in keys if r.get(k)})
    if admission is None:
        versions = sorted({r["policy_version"] for r in rows if r.get("policy_version")})
        return {"trajectory_ids": ids, "behaviour_versions": versions}
    return {
        "trajectory_ids": ids,
        "behaviour_versions": admission.behaviour_versions,
        "staleness_histogram": admission.staleness_histogram,
    }

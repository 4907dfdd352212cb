"""Per-episode evaluation outcomes, each policy's summary and the pairwise comparison (pure).

Both evaluation paths produce `Outcome`s: `agentstream eval` (episodes against policy endpoints,
producers/rollout/evaluate.py) and `infra.learn.heldout.evaluate` (in-process, one version). An
outcome's pairing key is (task, sample index, greedy): under the same evaluation the same key means
the same task and the same sampling seed, so two policies' outcomes with one key are a pair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import combinations

from infra.evaluation.stats import holm, mcnemar_exact, paired_bootstrap, pass_at_k, wilson_interval

ALPHA = 0.05


@dataclass(frozen=True)
class Outcome:
    """One evaluation episode: which task, which sample of it (its seed), and what came out."""

    task_id: str
    sample: int
    seed: int
    success: bool
    reward: float
    greedy: bool = False
    trajectory_id: str = ""

    @property
    def key(self) -> tuple[str, int, bool]:
        return (self.task_id, self.sample, self.greedy)


def episode_outcomes(results: Sequence, greedy: bool = False) -> list[Outcome]:
    """The outcomes of rollout-driver episodes (`producers.rollout.driver.EpisodeResult`: task_id,
    success, seed, reward, trajectory_id), each numbered by its rank among its task's episodes (the
    driver returns a task's samples in seed order, the same seeds for every endpoint).

    >>> from types import SimpleNamespace as R
    >>> rs = [R(task_id=t, success=s, seed=i, reward=float(s), trajectory_id="") for i, (t, s) in
    ...       enumerate([("a", True), ("b", False), ("a", False)])]
    >>> [(o.task_id, o.sample, o.success) for o in episode_outcomes(rs)]
    [('a', 0, True), ('b', 0, False), ('a', 1, False)]
    """
    seen: dict[str, int] = {}
    out = []
    for r in results:
        sample = seen.get(r.task_id, 0)
        seen[r.task_id] = sample + 1
        out.append(
            Outcome(r.task_id, sample, r.seed, bool(r.success), float(r.reward), greedy, r.trajectory_id)
        )
    return out


@dataclass(frozen=True)
class PolicySummary:
    """One policy's figures: sampled success with its 95% Wilson interval, greedy success, pass@k
    (mean over tasks of the unbiased estimate) and the mean reward of sampled episodes."""

    name: str
    episodes: int
    successes: int
    low: float
    high: float
    greedy_episodes: int
    greedy_successes: int
    mean_reward: float
    pass_at: dict[int, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.successes / self.episodes if self.episodes else math.nan

    @property
    def greedy_rate(self) -> float:
        return self.greedy_successes / self.greedy_episodes if self.greedy_episodes else math.nan

    def as_dict(self) -> dict:
        return asdict(self) | {"rate": self.rate, "greedy_rate": self.greedy_rate}


def pass_at_ks(outcomes: Sequence[Outcome], ks: Sequence[int]) -> dict[int, float]:
    """Mean pass@k over tasks of the sampled outcomes, for each k no larger than every task's count.

    >>> o = [Outcome("t", i, i, s, float(s)) for i, s in enumerate([1, 0, 0, 0])]
    >>> pass_at_ks(o, [1, 2, 8])
    {1: 0.25, 2: 0.5}
    """
    per_task: dict[str, list[bool]] = {}
    for o in outcomes:
        if not o.greedy:
            per_task.setdefault(o.task_id, []).append(o.success)
    if not per_task:
        return {}
    fewest = min(len(v) for v in per_task.values())
    return {
        k: sum(pass_at_k(len(v), sum(v), k) for v in per_task.values()) / len(per_task)
        for k in sorted(set(ks))
        if 1 <= k <= fewest
    }


def summarize(name: str, outcomes: Sequence[Outcome], ks: Sequence[int] = (1,)) -> PolicySummary:
    """The figures of one policy's outcomes.

    >>> o = [Outcome("t", 0, 0, True, 1.0), Outcome("t", 1, 1, False, 0.0)]
    >>> o.append(Outcome("t", 0, 0, True, 1.0, greedy=True))
    >>> s = summarize("A", o, ks=(1, 2))
    >>> (s.episodes, s.successes, s.greedy_successes, s.mean_reward, s.pass_at)
    (2, 1, 1, 0.5, {1: 0.5, 2: 1.0})
    """
    sampled = [o for o in outcomes if not o.greedy]
    greedy = [o for o in outcomes if o.greedy]
    wins = sum(o.success for o in sampled)
    low, high = wilson_interval(wins, len(sampled))
    mean_reward = sum(o.reward for o in sampled) / len(sampled) if sampled else math.nan
    return PolicySummary(
        name, len(sampled), wins, low, high, len(greedy), sum(o.success for o in greedy),
        mean_reward, pass_at_ks(sampled, ks),
    )  # fmt: skip


def paired(a: Sequence[Outcome], b: Sequence[Outcome], greedy: bool = False) -> list[tuple[Outcome, Outcome]]:
    """The pairs of two policies' outcomes (same key), sampled ones by default, in A's order.
    A key present on one side only (an episode that failed to run) has no pair and is left out.

    >>> a = [Outcome("t", 0, 0, True, 1.0), Outcome("t", 1, 1, False, 0.0)]
    >>> [(x.sample, y.success) for x, y in paired(a, [Outcome("t", 1, 1, True, 1.0)])]
    [(1, True)]
    """
    by_key = {o.key: o for o in b if o.greedy == greedy}
    return [(o, by_key[o.key]) for o in a if o.greedy == greedy and o.key in by_key]


@dataclass(frozen=True)
class PairComparison:
    """Policy A against policy B on their paired sampled episodes.

    `difference`: A's success rate minus B's over the pairs; `mcnemar_p`: the exact two-sided test;
    `reward_*`: the paired bootstrap of the mean reward difference; `holm_p` / `reward_holm_p`: the
    p-values adjusted across every pair of the evaluation; `verdict` reads `holm_p` at `alpha`
    (`mcnemar_p` for a pair compared alone)."""

    a: str
    b: str
    pairs: int
    a_only: int
    b_only: int
    difference: float
    mcnemar_p: float
    reward_difference: float
    reward_low: float
    reward_high: float
    reward_p: float
    holm_p: float = math.nan
    reward_holm_p: float = math.nan
    alpha: float = ALPHA

    @property
    def verdict(self) -> str:
        """At `alpha` on the Holm-adjusted p; a pair compared alone (`compare_pair`: one test, nothing
        to correct) on its own McNemar p.

        >>> win = [Outcome("t", i, i, True, 1.0) for i in range(8)]
        >>> lose = [Outcome("t", i, i, False, 0.0) for i in range(8)]
        >>> compare_pair("A", win, "B", lose, 200).verdict
        'A better'
        """
        p = self.mcnemar_p if math.isnan(self.holm_p) else self.holm_p
        if math.isnan(p) or p >= self.alpha:
            return "no significant difference"
        return f"{self.a if self.difference > 0 else self.b} better"

    def as_dict(self) -> dict:
        return asdict(self) | {"verdict": self.verdict}


def compare_pair(
    a_name: str, a: Sequence[Outcome], b_name: str, b: Sequence[Outcome],
    resamples: int = 10_000, seed: int = 0, alpha: float = ALPHA,
) -> PairComparison:  # fmt: skip
    """A against B on their paired sampled outcomes (no correction: see `compare_all`)."""
    pairs = paired(a, b)
    test = mcnemar_exact([x.success for x, _ in pairs], [y.success for _, y in pairs])
    boot = paired_bootstrap([x.reward for x, _ in pairs], [y.reward for _, y in pairs], resamples, seed)
    difference = (test.a_only - test.b_only) / len(pairs) if pairs else math.nan
    return PairComparison(
        a_name, b_name, len(pairs), test.a_only, test.b_only, difference, test.p_value if pairs else math.nan,
        boot.difference, boot.low, boot.high, boot.p_value, alpha=alpha,
    )  # fmt: skip


def compare_all(
    policies: Sequence[tuple[str, Sequence[Outcome]]],
    resamples: int = 10_000,
    seed: int = 0,
    alpha: float = ALPHA,
) -> list[PairComparison]:
    """Every pair of policies (in the order given), with both families of p-values Holm-adjusted
    across all the pairs.

    >>> win = [Outcome("t", i, i, True, 1.0) for i in range(8)]
    >>> lose = [Outcome("t", i, i, False, 0.0) for i in range(8)]
    >>> for c in compare_all([("A", win), ("B", lose), ("C", lose)], resamples=200):
    ...     print(c.a, c.b, c.mcnemar_p, c.holm_p, c.verdict)
    A B 0.0078125 0.0234375 A better
    A C 0.0078125 0.0234375 A better
    B C 1.0 1.0 no significant difference
    """
    from dataclasses import replace

    raw = [
        compare_pair(an, ao, bn, bo, resamples, seed, alpha)
        for (an, ao), (bn, bo) in combinations(policies, 2)
    ]
    success_holm = holm([c.mcnemar_p for c in raw])
    reward_holm = holm([c.reward_p for c in raw])
    return [
        replace(c, holm_p=h, reward_holm_p=r) for c, h, r in zip(raw, success_holm, reward_holm, strict=True)
    ]

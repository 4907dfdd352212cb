"""`agentstream eval`: a task set against one or more policy endpoints, and each one's success rate.

Episodes are played by the rollout driver (`run` -> `run_episode`), so they are recorded like any
rollout (the caller passes a recorder whose agent name is "eval"). This module owns the per-policy
tally and the 95% Wilson interval of a success rate (pure functions); comparing two policies uses
the leaderboard's significance test, which lives in infra (the CLI does it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from producers.envs.tasks import Task
from producers.rollout.driver import EpisodeResult, RolloutConfig, run

Z_95 = 1.959963984540054  # two-sided 95% normal quantile
Runner = Callable[[RolloutConfig, list[Task], object], list[EpisodeResult]]


@dataclass(frozen=True)
class PolicyScore:
    """One endpoint's outcome over the task set: successes of episodes and the 95% Wilson interval."""

    policy_url: str
    episodes: int
    successes: int
    low: float
    high: float
    outcomes: tuple[int, ...] = ()

    @property
    def rate(self) -> float:
        return self.successes / self.episodes if self.episodes else math.nan


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion; (nan, nan) without trials.

    >>> [round(x, 4) for x in wilson_interval(8, 10)]
    [0.4902, 0.9433]
    >>> wilson_interval(0, 0)
    (nan, nan)
    """
    if trials <= 0:
        return (math.nan, math.nan)
    if not 0 <= successes <= trials:
        raise ValueError(f"successes={successes}: must be between 0 and trials={trials}")
    p = successes / trials
    z2 = z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    return (max(0.0, centre - half), min(1.0, centre + half))


def score(policy_url: str, results: Sequence[EpisodeResult]) -> PolicyScore:
    """The tally of one endpoint's episodes.

    >>> r = EpisodeResult("t", "g", "tr", True, 1, False)
    >>> score("u", [r, r]).rate
    1.0
    """
    outcomes = tuple(int(r.success) for r in results)
    low, high = wilson_interval(sum(outcomes), len(outcomes))
    return PolicyScore(policy_url, len(outcomes), sum(outcomes), low, high, outcomes)


def evaluate(
    base: RolloutConfig, policy_urls: Sequence[str], tasks: list[Task], recorder, runner: Runner = run
) -> list[PolicyScore]:
    """Every task `base.group_size` times against each endpoint in turn (one score per endpoint)."""
    scores = []
    for url in policy_urls:
        config = replace(base, policy_url=url, forever=False)
        scores.append(score(url, runner(config, tasks, recorder)))
    return scores

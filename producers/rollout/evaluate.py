"""`agentstream eval`'s episodes: a task set played against each policy endpoint in turn, sampled and
greedy, by the rollout driver (`run` -> `run_episode`), so they are recorded like any rollout; the
caller passes a recorder made with `purpose="eval"`, which marks every episode so that no batch
builder trains on it.

Pairing: the driver gives sample j of every task the seed j (`_run_rounds`: round 0, index j) for
whichever endpoint it plays, so sample j of a task under two policies is a pair (same task, same
seed). Greedy episodes are one per task at temperature 0. The statistics over the outcomes live in
infra (`infra.evaluation`); this module only plays and tallies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from producers.envs.tasks import Task
from producers.rollout.driver import EpisodeResult, RolloutConfig, run

Runner = Callable[[RolloutConfig, list[Task], object], list[EpisodeResult]]


@dataclass(frozen=True)
class PolicyEpisodes:
    """One endpoint's episodes: `sampled` (`group_size` per task at the configured temperature) and
    `greedy` (one per task at temperature 0; empty without greedy)."""

    policy_url: str
    sampled: tuple[EpisodeResult, ...]
    greedy: tuple[EpisodeResult, ...] = ()


def evaluate(
    base: RolloutConfig,
    policy_urls: Sequence[str],
    tasks: list[Task],
    recorder,
    runner: Runner = run,
    greedy: bool = True,
) -> list[PolicyEpisodes]:
    """Every task `base.group_size` times against each endpoint in turn, then (with `greedy`) once
    more at temperature 0."""
    out = []
    for url in policy_urls:
        config = replace(base, policy_url=url, forever=False)
        sampled = tuple(runner(config, tasks, recorder))
        chosen = ()
        if greedy:
            chosen = tuple(runner(replace(config, temperature=0.0, group_size=1), tasks, recorder))
        out.append(PolicyEpisodes(url, sampled, chosen))
    return out

"""The evaluation gate (`agentstream train --gate`): a new version is served only when a held-out
evaluation does not show it significantly worse than the version serving now.

Between checkpointing a version and publishing it, `Gate.check` asks its injected evaluator (built
by the train command, `infra.training_gate`: consumers import neither producers nor infra) for
paired held-out outcomes of the candidate and of the serving version (the newest version not
refused; the base before any), applies `decide`, writes the decision into the checkpoint's
`state.json` (`last_event`) and returns the event to publish with `gate` / `gate_figures` set.
Saving first is what keeps a crash between the two from publishing an ungated event: on restart
the follower's `publish_unpublished` republishes the saved (gated) event, or gates one that was
saved before the decision (`Gate.check` on an event whose `gate` is set returns it unchanged).

The test (one-sided exact McNemar): over the pairs (same task, same sample seed), `worse` counts
those the serving version solved and the candidate did not, `better` the reverse. Under "not
worse" each discordant pair is a fair coin, so p = P(Binomial(worse + better, 1/2) >= worse); the
candidate is refused when p < alpha. No discordant pair: p = 1, accepted.

A refused version is still published (it stays in the lineage with its figures), and
`clients.current_policy` never makes it current, so the policy server, the rollout's horizon and
backpressure keep the version serving now. The executor goes back to the serving version's weights
(`Gate.settle` -> `executor.restore`: its checkpoint, adapter or full model plus optimizer state;
the base model with a fresh adapter and optimizer when the base serves), so the next version is
trained from the weights serving now (not from ones shown worse), its `previous_version` is the
serving version, and GRPO staleness is measured from it (training on from the refused weights
would drift from them, and after more than `--max-staleness` refusals in a row every group sampled
from the serving version would be dropped as stale: training would stall). Version numbers go on
(a refused number is never reused). The roll-back holds across restarts: `checkpoints.roll_back`
points `latest` at the serving checkpoint, and an executor that starts with `latest` on a refused
version rolls back first. Pure apart from the state file: no torch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from consumers.errors import TrainerError
from schemas.events import PolicyUpdated
from schemas.policy_versions import version_number

log = logging.getLogger(__name__)

Verdict = Literal["accepted", "refused"]


class GateUnavailable(TrainerError):
    """The gate could not evaluate a version (its checkpoint unreadable, the engine failing, ...).
    Not the batch's fault, so it is not dead-lettered (`retryable`: the consume loop re-raises it):
    the follower exits with the version checkpointed and unpublished, and gates it on restart
    (dead-lettering the batch would leave that version unpublished and the next one after a gap)."""

    retryable = True


@dataclass(frozen=True)
class PairedOutcomes:
    """Held-out outcomes of two versions, paired by position (same task, same sample seed).

    `extra`: further figures the evaluator reports (greedy rates, ...), copied into `gate_figures`.
    """

    serving_version: str
    serving: tuple[bool, ...]
    candidate: tuple[bool, ...]
    extra: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        if len(self.serving) != len(self.candidate):
            raise TrainerError(
                f"gate: {len(self.serving)} serving outcomes but {len(self.candidate)} candidate "
                "outcomes; the evaluation must pair them episode by episode"
            )
        if not self.serving:
            raise TrainerError("gate: no held-out episodes to compare (--gate-tasks, --gate-samples)")


class GateEvaluator(Protocol):
    """Plays the held-out tasks with `candidate` and with `serving` (None: the base model)."""

    def __call__(self, candidate: PolicyUpdated, serving: PolicyUpdated | None) -> PairedOutcomes: ...


@dataclass(frozen=True)
class GateDecision:
    verdict: Verdict
    figures: dict[str, float]


def worse_p_value(worse: int, better: int) -> float:
    """One-sided exact McNemar p of "the candidate is worse": P(X >= worse), X ~ Bin(worse + better, 1/2).

    >>> worse_p_value(5, 0)
    0.03125
    >>> worse_p_value(0, 0), worse_p_value(0, 7)
    (1.0, 1.0)
    >>> round(worse_p_value(8, 2), 6)  # (45 + 10 + 1) / 1024
    0.054688
    """
    if worse < 0 or better < 0:
        raise ValueError(f"worse={worse}, better={better}: counts must be >= 0")
    n = worse + better
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(worse, n + 1))
    return min(1.0, tail / 2**n)


def decide(serving: Sequence[bool], candidate: Sequence[bool], alpha: float) -> GateDecision:
    """Refuse `candidate` when it is significantly worse than `serving` on the paired outcomes.

    >>> decide([True] * 6, [False] * 6, 0.05).verdict
    'refused'
    >>> d = decide([True, False, True, True], [True, True, False, True], 0.05)
    >>> d.verdict, d.figures["worse"], d.figures["better"], d.figures["p_worse"]
    ('accepted', 1.0, 1.0, 0.75)
    """
    if not 0 < alpha < 1:
        raise TrainerError(f"--gate-alpha: must be in (0, 1), got {alpha!r}")
    if len(serving) != len(candidate) or not serving:
        raise TrainerError(
            f"gate: need equal, non-empty paired outcomes, got {len(serving)} and {len(candidate)}"
        )
    worse = sum(1 for s, c in zip(serving, candidate, strict=True) if s and not c)
    better = sum(1 for s, c in zip(serving, candidate, strict=True) if c and not s)
    p = worse_p_value(worse, better)
    n = len(serving)
    figures = {
        "episodes": float(n),
        "candidate_successes": float(sum(map(bool, candidate))),
        "serving_successes": float(sum(map(bool, serving))),
        "candidate_rate": sum(map(bool, candidate)) / n,
        "serving_rate": sum(map(bool, serving)) / n,
        "worse": float(worse),
        "better": float(better),
        "p_worse": p,
        "alpha": float(alpha),
    }
    return GateDecision("refused" if p < alpha else "accepted", figures)


class Gate:
    """`check(event, state)`: the gated event to publish, its decision saved in the checkpoint first.

    `serving()` names the version serving now (None before any: the base); the train command reads
    it from `policy.updates` through `clients.current_policy`, which skips refused versions.
    """

    def __init__(
        self,
        evaluate: GateEvaluator,
        serving: Callable[[], PolicyUpdated | None],
        alpha: float = 0.05,
    ):
        if not 0 < alpha < 1:
            raise TrainerError(f"--gate-alpha: must be in (0, 1), got {alpha!r}")
        self.evaluate, self.serving, self.alpha = evaluate, serving, alpha

    def settle(self, event: PolicyUpdated, executor: Any) -> PolicyUpdated:
        """`check` `event`, the version `executor` just checkpointed; when it is refused, the executor
        goes back to the serving version's weights (`executor.restore`) before it is published."""
        gated = self.check(event, executor.state)
        if gated.gate != "refused":
            return gated
        from consumers.training.checkpoints import restore_target

        try:
            target = restore_target(executor.state)  # None: decided before a restart, rolled back since
            if target is not None:
                executor.restore(target)
        except Exception as exc:
            raise GateUnavailable(
                f"gate: {gated.policy_version} refused, but the executor could not go back to the "
                f"weights of the version serving now ({exc!r}); it stops, and tries again when it starts"
            ) from exc
        if target is not None:
            log.warning("gate: %s refused; training goes on from %s's weights", gated.policy_version, target)
        return gated

    def check(self, event: PolicyUpdated, state: Any) -> PolicyUpdated:
        """Gate `event` (the version `state` just checkpointed) unless it already carries a decision."""
        if event.gate:
            return event
        serving, stage = None, "read the serving version"
        try:
            serving = self.serving()
            if serving is not None and serving.policy_version == event.policy_version:
                raise TrainerError(f"{event.policy_version} is already the serving version")
            stage = f"evaluate it against {serving.policy_version if serving else 'base'}"
            outcomes = self.evaluate(event, serving)
        except Exception as exc:
            raise GateUnavailable(
                f"gate: {event.policy_version}: could not {stage} ({exc!r}); it is checkpointed and "
                "unpublished, and is gated when the executor starts again"
            ) from exc
        decision = decide(outcomes.serving, outcomes.candidate, self.alpha)
        figures = {**outcomes.extra, **decision.figures, "serving_version": _number(outcomes.serving_version)}
        gated = PolicyUpdated.model_validate(
            {**event.model_dump(), "gate": decision.verdict, "gate_figures": figures}
        )
        save_decision(state, gated)
        self._log(gated, outcomes.serving_version)
        return gated

    def _log(self, gated: PolicyUpdated, serving_version: str) -> None:
        f = gated.gate_figures
        log.log(
            logging.WARNING if gated.gate == "refused" else logging.INFO,
            "gate: %s %s against %s (success %.3f vs %.3f over %d paired episodes; worse %d, better %d, "
            "one-sided McNemar p %.4g, alpha %g)",
            gated.policy_version, gated.gate, serving_version, f["candidate_rate"], f["serving_rate"],
            int(f["episodes"]), int(f["worse"]), int(f["better"]), f["p_worse"], self.alpha,
        )  # fmt: skip


def save_decision(state: Any, gated: PolicyUpdated) -> None:
    """Record `gated` as `state`'s last event and rewrite its checkpoint's `state.json`."""
    from consumers.training import checkpoints

    if state.policy_version != gated.policy_version:
        raise TrainerError(
            f"gate: the checkpoint state is at {state.policy_version!r}, the gated event is "
            f"{gated.policy_version!r}; not saving a decision for another version"
        )
    state.last_event = gated.model_dump(mode="json")
    path = Path(gated.checkpoint_path)
    if not (path / "state.json").exists():
        raise TrainerError(f"gate: checkpoint {path} has no state.json to record the decision in")
    checkpoints.save_state(path.parent, state)


def _number(version: str) -> float:
    """A version as a figure: its number (v3 -> 3), 0 for the base, -1 for one without a number."""
    if version == "base":
        return 0.0
    number = version_number(version)
    return float(number) if number is not None else -1.0

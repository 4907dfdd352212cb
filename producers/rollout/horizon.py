"""The interaction horizon schedule (ScalingInter-RL) and the policy progress it is read against.

`HorizonSchedule` is pure: the most interaction turns an episode may take at a given training
progress, growing in stages. Its one string form (the `agentstream rollout --horizon` option) lists
the stages as `STEP=TURNS` pairs, e.g. `"0=4,100=8,200=16"`: 4 turns from step 0, 8 from step 100,
16 from step 200 on. Steps must increase and turns must not decrease; before the first stage the
first stage's turns apply. The driver enforces the horizon while the episode runs (the step that
reaches it is truncated), so nothing is cut after the fact.

`PolicyProgress` follows the current policy (`clients.current_policy`; poll-based, thread-safe): its
training `step` and `policy_version`, 0 / None while there is none or the broker cannot be reached.
It only reads; it must never stop the rollout.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from dataclasses import dataclass
from itertools import pairwise

from clients.current_policy import CurrentPolicyReader
from producers.errors import ProducerError
from schemas.topics import POLICY_UPDATES

log = logging.getLogger(__name__)

FORMAT_HINT = "STEP=TURNS stages like 0=4,100=8,200=16"


@dataclass(frozen=True)
class HorizonSchedule:
    """Turns per episode by training progress: `stages` are (from_step, turns), steps increasing.

    >>> schedule = HorizonSchedule.parse("0=4,100=8,200=16")
    >>> [schedule.horizon_at(k) for k in (0, 99, 100, 150, 10_000)]
    [4, 4, 8, 8, 16]
    """

    stages: tuple[tuple[int, int], ...]

    def __post_init__(self):
        if not self.stages:
            raise ProducerError(f"--horizon: expected {FORMAT_HINT}, got no stages")
        steps = [s for s, _ in self.stages]
        turns = [t for _, t in self.stages]
        if any(s < 0 for s in steps) or any(b <= a for a, b in pairwise(steps)):
            raise ProducerError(f"--horizon: stage steps must be >= 0 and increasing, got {steps!r}")
        if any(t < 1 for t in turns) or any(b < a for a, b in pairwise(turns)):
            raise ProducerError(f"--horizon: turns must be >= 1 and never decrease, got {turns!r}")

    @property
    def initial(self) -> int:
        return self.stages[0][1]

    @property
    def final(self) -> int:
        return self.stages[-1][1]

    def horizon_at(self, progress: int) -> int:
        """The turn limit at `progress` (the newest policy's training step); monotone, clamped to
        [initial, final]."""
        index = bisect.bisect_right([s for s, _ in self.stages], max(0, progress)) - 1
        return self.stages[max(0, index)][1]

    @classmethod
    def parse(cls, text: str) -> HorizonSchedule:
        """`"0=4,100=8"` -> stages ((0, 4), (100, 8)); a bad string names itself in the error."""
        stages = []
        for part in text.split(","):
            step, sep, turns = part.strip().partition("=")
            try:
                if not sep:
                    raise ValueError(part)
                stages.append((int(step), int(turns)))
            except ValueError:
                raise ProducerError(f"--horizon: expected {FORMAT_HINT}, got {text!r}") from None
        return cls(tuple(stages))


def parse_horizon(text: str) -> HorizonSchedule | None:
    """The schedule of a `--horizon` value; None for "" (no schedule: `max_turns` applies)."""
    return HorizonSchedule.parse(text) if text.strip() else None


class PolicyProgress:
    """The current policy (`clients.current_policy`): `step()` and `version()`.

    Asks the reader at most once per `poll_s` seconds, under a lock (episodes ask from several
    threads). An unreachable broker is logged and leaves the last values in place.
    """

    def __init__(
        self, bootstrap_servers: str, poll_s: float = 5.0, clock=time.monotonic, timeout_ms: int = 5000
    ):
        self.bootstrap_servers, self.poll_s, self.clock = bootstrap_servers, poll_s, clock
        # bounds a read when the broker is away (kafka-python waits 30 s)
        self._reader = CurrentPolicyReader(
            bootstrap_servers, timeout_ms / 1000, "agentstream-rollout-progress"
        )
        self._step, self._version = 0, None
        self._lock = threading.Lock()
        self._last_poll: float | None = None

    def step(self) -> int:
        self.refresh()
        return self._step

    def version(self) -> str | None:
        self.refresh()
        return self._version

    def refresh(self, force: bool = False) -> None:
        """Ask for the current policy (at most once per `poll_s` unless `force`)."""
        with self._lock:
            now = self.clock()
            if not force and self._last_poll is not None and now - self._last_poll < self.poll_s:
                return
            self._last_poll = now
            try:
                current = self._reader.current()
            except Exception as exc:  # progress is advisory: keep sampling on the last values
                log.warning(
                    "rollout: cannot follow %s (%r); progress stays at step %d",
                    POLICY_UPDATES,
                    exc,
                    self._step,
                )
                return
            if current is not None:
                self._step, self._version = current.step, current.policy_version

    def close(self) -> None:
        self._reader.close()

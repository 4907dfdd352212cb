"""The evaluation gate's in-process evaluator, built by `agentstream train --gate` and injected into
the follower (`consumers.training.gate.Gate`; consumers import neither producers nor infra).

`HeldoutGateEvaluator(candidate, serving)` loads the base model once (`producers.policy.engine.local`,
as the policy server does), puts each version's checkpoint beside it (`with_checkpoint`: a LoRA
adapter or a full fine-tune; `serving=None` is the base itself) and plays the held-out tasks with
both through the one evaluation path, `infra.learn.heldout.evaluate`, with the same seed: sample j of
task i has the same sampling seed for both versions, and the greedy episode of each task too, so the
outcomes are paired by `Outcome.key` (task, sample, greedy). Every paired episode, sampled and greedy,
enters the test. A version's score is kept (by version and checkpoint path), so the serving version
is played once, not once per candidate.

The tasks: a task file as `agentstream rollout` reads (`producers.envs.tasks`), calc tasks only (the
held-out evaluation plays the calc env); every line is checked when the command starts. Costs: one
more copy of the base model in the executor's process, and `tasks x (samples + 1)` episodes per
version, rank 0 only (the other ranks wait on their next batch).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from consumers.errors import ConsumerConfigError
from consumers.training.config import TrainRunConfig
from consumers.training.gate import Gate, PairedOutcomes
from schemas.events import PolicyUpdated

log = logging.getLogger(__name__)

TEMPERATURE = 1.0  # the sampled episodes' temperature (as `demo --learn` evaluates)
MAX_TURNS = 3  # turns per held-out episode (as `demo --learn`: calculator, submit, one spare)
MAX_TASKS = 10_000
TASK_KEYS = ("task_id", "env", "task", "domain")  # a task line's keys (producers.envs.tasks)
CALC_TASK_KEYS = ("expression",)  # what the gate plays of a calc task


def max_gate_samples() -> int:
    """`--gate-samples`' bound: `heldout.evaluate` seeds sample j of task i with `seed + 1000 * i + j`
    and the greedy episode with slot `GREEDY_SEED_OFFSET`, so more samples would share seeds."""
    from infra.learn.heldout import GREEDY_SEED_OFFSET

    return GREEDY_SEED_OFFSET


def check_gate_samples(samples: int) -> int:
    """`--gate-samples` within 1..max_gate_samples() (`ConsumerConfigError` naming it otherwise)."""
    if not 1 <= samples <= max_gate_samples():
        raise ConsumerConfigError(
            f"--gate-samples: must be between 1 and {max_gate_samples()} (held-out seeds are "
            f"seed + 1000 * task + sample), got {samples!r}"
        )
    return samples


def gate_expressions(path: Path) -> tuple[str, ...]:
    """The calc expressions of a task file, in order. `ConsumerConfigError` naming the file, the line
    and the field for: a line that is not a task, an unknown key (on the line or in its `task`), a
    task of another env or without an expression, a repeated task_id, and a repeated expression
    (the outcomes are paired by expression: a repeat would be played and not counted)."""
    from producers.envs.arithmetic import safe_eval

    expressions: dict[str, int] = {}  # expression -> its line
    for number, row in _task_rows(path):
        where = f"--gate-tasks: {path}:{number}: task {row['task_id']!r}"
        if row["env"] != "calc":
            raise ConsumerConfigError(f"{where}: field 'env': the gate plays calc tasks, got {row['env']!r}")
        task = row.get("task", {})
        unknown = [key for key in task if key not in CALC_TASK_KEYS]
        if unknown:
            raise ConsumerConfigError(
                f"{where}: unknown key 'task.{unknown[0]}' (a gate task has {CALC_TASK_KEYS})"
            )
        expression = task.get("expression")
        if not isinstance(expression, str) or not expression.strip():
            raise ConsumerConfigError(
                f"{where}: field 'task.expression': expected a string, got {expression!r}"
            )
        try:
            safe_eval(expression)
        except Exception as exc:
            raise ConsumerConfigError(f"{where}: field 'task.expression': {expression!r} ({exc})") from None
        if expression in expressions:
            raise ConsumerConfigError(
                f"{where}: field 'task.expression': {expression!r} repeats line {expressions[expression]} "
                "(held-out outcomes are paired by expression: give each expression once)"
            )
        expressions[expression] = number
    return tuple(expressions)


def _task_rows(path: Path) -> list[tuple[int, dict]]:
    """(line number, row) of every task line, each a task (`producers.envs.tasks.parse_task_line`)
    with no key beyond TASK_KEYS and a task_id of its own; at least one, at most MAX_TASKS."""
    from producers.envs.errors import EnvError
    from producers.envs.tasks import parse_task_line
    from schemas.json_input import json_object

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConsumerConfigError(f"--gate-tasks: {path}: cannot be read ({exc})") from None
    rows, ids = [], {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"--gate-tasks: {path}:{number}"
        if len(rows) == MAX_TASKS:
            raise ConsumerConfigError(f"{where}: more than {MAX_TASKS} tasks")
        row = json_object(line, where, ConsumerConfigError)
        unknown = [key for key in row if key not in TASK_KEYS]
        if unknown:
            raise ConsumerConfigError(f"{where}: unknown key {unknown[0]!r} (a task line has {TASK_KEYS})")
        try:
            parse_task_line(line, f"{path}:{number}")
        except EnvError as exc:
            raise ConsumerConfigError(f"--gate-tasks: {exc}") from None
        if row["task_id"] in ids:
            raise ConsumerConfigError(
                f"{where}: task_id {row['task_id']!r} repeats line {ids[row['task_id']]}"
            )
        ids[row["task_id"]] = number
        rows.append((number, row))
    if not rows:
        raise ConsumerConfigError(f"--gate-tasks: {path} has no task")
    return rows


def base_model_dir(run: TrainRunConfig) -> Path:
    """The executor's base model directory (`--base-model`; 'tiny' is built under `--data-dir`)."""
    if run.train.base_model == "tiny":
        from consumers.tiny_model import tiny_model_dir

        return tiny_model_dir(run.data_dir)
    path = Path(run.train.base_model)
    if not path.is_dir():
        raise ConsumerConfigError(
            f"--base-model: {run.train.base_model!r} is not a local directory (or 'tiny')"
        )
    return path


@dataclass
class HeldoutGateEvaluator:
    """Plays `expressions` with two versions, paired (see the module docstring)."""

    base_dir: Path
    expressions: tuple[str, ...]
    samples: int
    seed: int
    temperature: float = TEMPERATURE
    max_turns: int = MAX_TURNS
    device: str = "cpu"
    _base: Any = field(default=None, repr=False)
    _scores: dict[tuple[str, str], Any] = field(default_factory=dict, repr=False)

    def __call__(self, candidate: PolicyUpdated, serving: PolicyUpdated | None) -> PairedOutcomes:
        ids = (serving.base_model_id if serving is not None else "", candidate.base_model_id)
        if all(ids) and ids[0] != ids[1]:  # '' is unknown: not checked
            raise ValueError(
                f"{serving.policy_version} was trained on base_model_id {serving.base_model_id!r}, "
                f"{candidate.policy_version} on {candidate.base_model_id!r}: not comparable"
            )
        old = self._score(serving)
        new = self._score(candidate)
        old_by, new_by = {o.key: o for o in old.outcomes}, {o.key: o for o in new.outcomes}
        if set(old_by) != set(new_by):
            raise ValueError(f"unpaired outcomes: {sorted(set(old_by) ^ set(new_by))[:5]}")
        keys = sorted(old_by)
        extra = {
            "tasks": float(len(self.expressions)),
            "samples_per_task": float(self.samples),
            "candidate_sampled_rate": new.rate,
            "serving_sampled_rate": old.rate,
            "candidate_greedy_rate": new.greedy_rate,
            "serving_greedy_rate": old.greedy_rate,
        }
        return PairedOutcomes(
            serving.policy_version if serving is not None else "base",
            tuple(old_by[k].success for k in keys),
            tuple(new_by[k].success for k in keys),
            extra,
        )

    def _score(self, version: PolicyUpdated | None):
        from infra.learn.heldout import evaluate

        key = ("base", "") if version is None else (version.policy_version, version.checkpoint_path)
        if key not in self._scores:
            engine = self._engine(version)
            self._scores[key] = evaluate(
                engine,
                self.expressions,
                self.samples,
                self.temperature,
                self.max_turns,
                self.seed,
                greedy=True,
            )
            log.info("gate: %s scored %.3f sampled, %.3f greedy", key[0], self._scores[key].rate,
                     self._scores[key].greedy_rate)  # fmt: skip
        return self._scores[key]

    def _engine(self, version: PolicyUpdated | None):
        if self._base is None:
            from producers.policy.engine.local import LocalEngine

            self._base = LocalEngine(self.base_dir, version="base", device=self.device)
        if version is None:
            return self._base
        if not version.checkpoint_path:
            raise ValueError(f"{version.policy_version}: its policy.updated has no checkpoint_path")
        return self._base.with_checkpoint(Path(version.checkpoint_path), version.policy_version)


def check_gate_options(run: TrainRunConfig) -> tuple[str, ...]:
    """`--gate`'s options beyond the config's own checks, before any training (and before a group
    is launched): `--gate-samples` within bounds and the `--gate-tasks` file; its expressions.
    Nothing without `--gate`."""
    if not run.gate:
        return ()
    check_gate_samples(run.gate_samples)
    return gate_expressions(Path(run.gate_tasks or ""))


def build_gate(run: TrainRunConfig) -> Gate | None:
    """The gate `--gate` asks for (None without it): the held-out tasks checked now, the serving
    version read from `policy.updates` by `clients.current_policy` (which skips refused versions)."""
    if not run.gate:
        return None
    from clients.current_policy import read_current_policy

    expressions = check_gate_options(run)  # checked before the model is built
    evaluator = HeldoutGateEvaluator(
        base_model_dir(run), expressions, run.gate_samples, run.train.seed, device=run.train.device or "auto"
    )
    return Gate(
        evaluator,
        lambda: read_current_policy(run.bootstrap_servers, timeout_s=30.0),
        run.gate_alpha,
    )

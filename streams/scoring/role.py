"""The scoring role in faust: rule rewards and trajectory assembly in one agent over agent.events,
the judge's rewards and human feedback, through the one batch shell; a timer emits what the grace
period allows.

Every role folder has the same files: `processor.py` (pure batch logic, no faust) and `role.py`
(`register(app, config)`: its tables, agents and timers on the shell, streams/shell.py).
"""

from __future__ import annotations

import logging
from functools import partial

from streams import faust_compat
from streams.assembler.processor import TrajectoryAssembler
from streams.batch import STATE
from streams.config import WorkerConfig
from streams.rules.processor import RuleRewarder
from streams.rules.profiles import ProfileRegistry
from streams.scoring.processor import RULES_TABLE, Scoring
from streams.shell import BatchShell

log = logging.getLogger(__name__)


def register(app, config: WorkerConfig) -> Scoring:
    """Add the `scoring` agent and its grace timer to `app`; returns its processor."""
    rules = RuleRewarder(ProfileRegistry.from_file(config.profiles_path), config.reward_version)
    processor = Scoring(rules, assembler_for(config))
    shell = BatchShell(
        app,
        processor.name,
        config.partitions,
        {STATE: STATE, RULES_TABLE: RULES_TABLE},
        forget=processor.forget,
    )
    process = partial(processor.process, get_rules=shell.get(RULES_TABLE), get_state=shell.get())
    run_assembly(app, config, shell, processor.assembler, processor.sources, process)
    return processor


def assembler_for(config: WorkerConfig) -> TrajectoryAssembler:
    """The assembler of `config`: its profiles, grace period, judge expectations and rule version."""
    return TrajectoryAssembler(
        ProfileRegistry.from_file(config.profiles_path),
        config.grace_seconds,
        judge_mode=judge_mode_function(config),
        rule_version=config.reward_version,  # the version the rules half stamps
    )


def run_assembly(
    app, config: WorkerConfig, shell: BatchShell, assembler: TrajectoryAssembler, sources, process
) -> None:
    """The agent: batches of `sources` through `process`, and a timer that emits what the grace
    period allows; restored trajectories first."""
    get_state, restored = shell.get(), _Restored(assembler, shell)

    def process_batch(records):
        restored.track()
        return process(records)

    def expire():
        restored.track()
        result = assembler.expire(get_state)
        if result.outputs:
            log.info("%s: grace period over for %d trajectories", shell.name, len(result.outputs))
        return result

    source = shell.source(*sources)
    shell.consume_in_batches(source, config.batch_max, process_batch, pace_s=config.batch_pace_ms / 1000)
    shell.size_fetches(config.fetch_min_bytes, config.fetch_max_wait_ms, config.fetch_idle_wait_ms)

    @app.agent(source, name=shell.name)
    async def assemble(stream):
        await shell.hold(stream)  # subscribes; the batches come through consume_in_batches

    @app.timer(config.timer_interval_s, name=f"{shell.name}-grace")
    async def grace():
        if faust_compat.recovery_completed(app):
            await shell.tick(expire)


class _Restored:
    """Once, before the first batch or tick after recovery: grace periods of restored trajectories
    start now, and the ones that may still emit (and the calibration maps) are loaded."""

    def __init__(self, processor: TrajectoryAssembler, shell: BatchShell):
        self.processor, self.shell, self.done = processor, shell, False

    def track(self) -> None:
        if self.done:
            return
        self.done = True
        self.processor.started_at = self.processor.clock()
        count = self.processor.track_restored(list(self.shell.store().items()))
        log.info("%s: %d restored trajectories may still emit", self.shell.name, count)


def judge_mode_function(config: WorkerConfig):
    """`started -> judge mode or None`: whether the judge is expected to score a trajectory.

    Uses `streams.judge.selection.JudgeRules` with `config.judge_rules_path`. Without a rules file
    the judge is expected only when it runs beside scoring (`expect_judge`), under its default
    rule; otherwise never (scoring then waits only for its rule rewards)."""
    from streams.judge.selection import JudgeRules

    load = JudgeRules.for_judge if config.expect_judge else JudgeRules.load
    rules = load(config.judge_rules_path)
    if not rules.rules:
        return lambda started: None
    return rules.mode_for

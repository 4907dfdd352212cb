"""The scoring role in faust: the rules and the assembler in one agent over agent.events, the
judge's rewards and human feedback, through the one batch shell; a timer emits what the grace
period allows (the assembler's, streams/assembler/role.py).

Every role folder has the same files: `processor.py` (pure batch logic, no faust) and `role.py`
(`register(app, config)`: its tables, agents and timers on the shell, streams/shell.py).
"""

from __future__ import annotations

from functools import partial

from streams.assembler.role import assembler_for, run_assembly
from streams.batch import STATE
from streams.config import WorkerConfig
from streams.rules.processor import RuleRewarder
from streams.rules.profiles import ProfileRegistry
from streams.scoring.processor import RULES_TABLE, Scoring
from streams.shell import BatchShell


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

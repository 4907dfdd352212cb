"""The rule-reward role in faust: agent.events -> reward.rule, through the one batch shell.

Every role folder has the same files: `processor.py` (pure batch logic, no faust) and `role.py`
(`register(app, config)`: its tables, agents and timers on the shell, streams/shell.py).
"""

from __future__ import annotations

from functools import partial

from streams.config import WorkerConfig
from streams.rules.processor import RuleRewarder
from streams.rules.profiles import ProfileRegistry
from streams.shell import BatchShell


def register(app, config: WorkerConfig) -> RuleRewarder:
    """Add the `rules` agent to `app`; returns its processor."""
    processor = RuleRewarder(ProfileRegistry.from_file(config.profiles_path), config.reward_version)
    shell = BatchShell(app, processor.name, config.partitions, forget=processor.cache.clear)
    process = partial(processor.process, get_state=shell.get())

    source = shell.source(*processor.sources)
    shell.consume_in_batches(source, config.batch_max, process, pace_s=config.batch_pace_ms / 1000)
    shell.size_fetches(config.fetch_min_bytes, config.fetch_max_wait_ms, config.fetch_idle_wait_ms)

    @app.agent(source, name=processor.name)
    async def rules(stream):
        await shell.hold(stream)  # subscribes; the batches come through consume_in_batches

    return processor

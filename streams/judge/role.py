"""The LLM judge role in faust: agent.events -> reward.judge, through the one batch shell.

`register(app, config)` adds, on the shell (streams/shell.py) every role uses:

- `judge` (stable name: consumer group, table and log name): batches of agent events go to the
  `JudgeProcessor` (which judges concurrently under a semaphore); the shell publishes the results
  and stores the state (table `judge-trajectories`, changelog-backed, so a restarted worker keeps
  its batching and context state) before the offsets move (at-least-once; deterministic event ids
  make replays idempotent).
- `judge-groups`: group mode needs every trajectory of a `group_id`, but `agent.events` is keyed
  by trajectory id, so members of one group sit in different partitions. The processor forwards
  each ended group-mode trajectory to the role's internal topic keyed by group id; this agent
  collects them in the table `judge-groups` and scores a group in one call when it is complete
  (the expected size is known) or has been quiet for `group_wait_s`.
- timers: quiet groups, stale step batches and the state TTL, published through the same shell.

Which trajectories: the rules file's rules, or without one the default rule
(`streams.judge.selection.DEFAULT_RULE`: every trajectory, judged as a whole). Which API:
`JudgeConfig.provider` (streams/judge/providers/), behind the one `JudgeClient`.

Every role folder has the same files: `processor.py` (batch logic, no faust) and `role.py`.
"""

from __future__ import annotations

import logging

from streams.judge.config import JudgeConfig, resolve_config
from streams.judge.state import BytesKeyed
from streams.shell import BatchShell

log = logging.getLogger(__name__)

NAME = "judge"
GROUPS_NAME = "judge-groups"
TABLES = {"state": f"{NAME}-trajectories", "groups": GROUPS_NAME}  # changelog names kept as they are


def register(app, config: object | None = None):
    """Add the judge agents to a faust app. Returns the `JudgeProcessor`, or None when the judge is
    off (no API key).

    `config`: a `JudgeConfig`, an object with a `.judge` attribute holding one (the worker's), or
    None to read `AGENTSTREAM_JUDGE_*` (and the provider's key variable) from the environment.
    """
    cfg = resolve_config(config)
    if not cfg.enabled:
        log.warning(
            "%s: no API key (AGENTSTREAM_JUDGE_API_KEY or %s, provider %s); the LLM judge is off",
            NAME,
            cfg.key_variable,
            cfg.provider,
        )
        return None
    processor = build_processor(cfg)
    from streams.judge.ledger import share_state

    # budget + reply cache shared by replicas, restarts and replays (docs/judge-cost.md)
    share_state(app, processor, getattr(config, "ledger_prefix", None))
    shell = _shell(app, processor)
    _add_agents(app, cfg, processor, shell)
    _add_timers(app, cfg, processor, shell)
    return processor


def build_processor(cfg: JudgeConfig):
    """The role's `JudgeProcessor`: the rules file's rules, or the default rule when none is
    configured (`JudgeRules.for_judge`: every trajectory, judged as a whole); a rules file
    configured but missing raises `JudgeRulesError` naming it."""
    from streams.judge.client import JudgeClient
    from streams.judge.processor import JudgeProcessor
    from streams.judge.rubrics import RubricCatalog
    from streams.judge.selection import DEFAULT_RULES, JudgeRules

    rules = JudgeRules.for_judge(cfg.rules_path)
    if rules is DEFAULT_RULES:
        log.info(
            "%s: no judge rules file (AGENTSTREAM_JUDGE_RULES_PATH); default rule %r: every trajectory, "
            "judged as a whole",
            NAME,
            DEFAULT_RULES.rules[0].name,
        )
    elif not rules.rules:
        log.warning("%s: judge rules file %s holds no rules; nothing will be judged", NAME, cfg.rules_path)
    catalog = RubricCatalog.load(cfg.rubrics_path)
    return JudgeProcessor(cfg, rules, catalog, JudgeClient(cfg))


def _shell(app, processor) -> BatchShell:
    from schemas.topics import AGENT_EVENTS, TOPICS

    # the worker sets topic_partitions from the source topics; the tables must match them
    partitions = int(getattr(app.conf, "topic_partitions", 0) or TOPICS[AGENT_EVENTS].partitions)
    shell = BatchShell(app, NAME, partitions, TABLES)
    shell.internal_topic(GROUPS_NAME, partitions)
    processor.bind(BytesKeyed(shell.store("state")), BytesKeyed(shell.store("groups")))
    return shell


def _add_agents(app, cfg: JudgeConfig, processor, shell: BatchShell) -> None:
    from schemas.topics import AGENT_EVENTS

    @app.agent(shell.source(AGENT_EVENTS), name=NAME)
    async def judge(stream):
        await shell.consume(stream, cfg.take_max, cfg.take_within_s, processor.process_records)

    @app.agent(shell.forward_topic, name=GROUPS_NAME)
    async def judge_groups(stream):
        await shell.consume(
            stream, cfg.take_max, cfg.take_within_s, processor.process_group_records, GROUPS_NAME
        )


def _add_timers(app, cfg: JudgeConfig, processor, shell: BatchShell) -> None:
    @app.timer(interval=max(1.0, min(cfg.group_wait_s / 4, 30.0)), name=f"{GROUPS_NAME}-timeout")
    async def judge_groups_timeout():
        await shell.tick(processor.flush_quiet_groups)

    @app.timer(interval=max(1.0, min(cfg.step_wait_s / 4, 30.0)), name=f"{NAME}-step-timeout")
    async def judge_steps_timeout():
        await shell.tick(processor.flush_stale_steps)

    @app.timer(interval=max(1.0, min(cfg.state_ttl_s / 4, 600.0)), name=f"{NAME}-state-ttl")
    async def judge_state_ttl():
        await shell.tick(processor.expire_state)

"""The faust shell of the LLM judge: consume `agent.events`, publish to `reward.judge`.

`register_judge_agents(app, config)` is the hook the worker's app factory calls when its role
includes "judge". It adds two agents:

- `judge` (stable name; consumer group, table and log name): takes batches of agent events with
  `stream.take_events`, hands them to the pure-ish `JudgeProcessor` (which judges concurrently under
  a semaphore), publishes the results, and only then moves on, so offsets are committed after the
  scores are on the topic (at-least-once; deterministic event ids make replays idempotent).
  Per-trajectory state lives in the faust table `judge-trajectories` (changelog-backed, so a
  restarted worker keeps its batching and context state).
- `judge-groups`: group mode needs every trajectory of a `group_id`, but `agent.events` is keyed by
  trajectory id, so members of one group sit in different partitions. The `judge` agent forwards
  each ended group-mode trajectory to an internal topic keyed by group id; this agent collects them
  in the table `judge-groups` and scores a group in one call when it is complete (the expected
  size is known) or has been quiet for `group_wait_s`.

Undecodable input goes to the DLQ with its coordinates; nothing is dropped silently. As in the
rules and assembler agents, a batch that follows records the agent never received (an offset gap),
or whose outputs the broker did not acknowledge, exits the role (code 70) before faust acks it, and
`agentstream worker` restarts the role from the committed offsets; a stopping agent lets its batch
finish first.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping

import orjson

from streams.agents import check_continuity, finish_batch
from streams.judge.config import JudgeConfig, resolve_config
from streams.offsets import OffsetContinuity

log = logging.getLogger(__name__)

NAME = "judge"
GROUPS_NAME = "judge-groups"


def register_judge_agents(app, config: object | None = None):
    """Add the judge agents to a faust app. Returns the `JudgeProcessor`, or None when the judge is
    off (no API key) or no rules file selects anything.

    `config`: a `JudgeConfig`, an object with a `.judge` attribute holding one, or None to read
    `AGENTSTREAM_JUDGE_*` / `ANTHROPIC_API_KEY` from the environment.
    """
    cfg = resolve_config(config)
    if not cfg.enabled:
        log.warning("%s: no API key (ANTHROPIC_API_KEY); the LLM judge is off", NAME)
        return None
    from streams.judge.processor import JudgeProcessor

    processor = JudgeProcessor.from_config(cfg)
    if not processor.rules.rules:
        log.warning("%s: no judge rules (AGENTSTREAM_JUDGE_RULES_PATH); nothing will be judged", NAME)
    _add_agents(app, cfg, processor)
    return processor


def _add_agents(app, cfg: JudgeConfig, processor) -> None:
    from schemas.topics import AGENT_EVENTS, REWARD_JUDGE, TOPICS

    # the worker sets topic_partitions from the source topics; the tables must match them
    partitions = int(getattr(app.conf, "topic_partitions", 0) or TOPICS[AGENT_EVENTS].partitions)
    source = app.topic(AGENT_EVENTS, value_serializer="raw", key_serializer="raw")
    sink = app.topic(REWARD_JUDGE, value_serializer="raw", key_serializer="raw")
    groups_topic = app.topic(
        f"{app.conf.id}-{GROUPS_NAME}",
        value_serializer="raw",
        key_serializer="raw",
        partitions=partitions,
        internal=True,  # faust creates it at start-up
    )
    # use_partitioner: a key's changelog partition comes from the producer's partitioner (murmur2 of
    # the key bytes), the same as the source topics', so writes made after a batch (take_events)
    # or by a timer land in the right partition without faust's per-event context.
    # key_type/value_type bytes: the raw serializer for the changelog too (recovery decodes with it).
    table_options = {
        "partitions": partitions,
        "use_partitioner": True,
        "key_type": bytes,
        "value_type": bytes,
    }
    tables = {
        "state": app.Table(f"{NAME}-trajectories", **table_options),
        "groups": app.Table(GROUPS_NAME, **table_options),
    }
    processor.bind(BytesKeyed(tables["state"]), BytesKeyed(tables["groups"]))

    async def step(work) -> None:
        """One entry point: judge, publish (acked), then store the state (acked). Offsets move
        after this returns, so a crash anywhere replays the input against the old state."""
        async with processor.lock:
            result = await work()
            await _publish(app, sink, groups_topic, result)
            await _store(app, tables, processor.take_updates())

    async def take_batch(name: str, batch, continuity: OffsetContinuity, process) -> None:
        """As in the rules and assembler agents (streams/agents.py): a batch that follows records
        never received, or whose outputs were not acknowledged, exits the role before faust acks
        it; a stopping agent lets its batch finish first."""
        await check_continuity(app, name, batch, continuity)
        records = [_record(e) for e in batch]
        log.debug("%s: batch of %d record(s)", name, len(records))
        await finish_batch(name, lambda: step(lambda: process(records)))

    @app.agent(source, name=NAME)
    async def judge(stream):
        continuity = OffsetContinuity()
        async for batch in stream.take_events(cfg.take_max, within=cfg.take_within_s):
            await take_batch(NAME, batch, continuity, processor.process_records)

    @app.agent(groups_topic, name=GROUPS_NAME)
    async def judge_groups(stream):
        continuity = OffsetContinuity()
        async for batch in stream.take_events(cfg.take_max, within=cfg.take_within_s):
            await take_batch(GROUPS_NAME, batch, continuity, processor.process_group_records)

    @app.timer(interval=max(1.0, min(cfg.group_wait_s / 4, 30.0)), name=f"{GROUPS_NAME}-timeout")
    async def judge_groups_timeout():
        await step(processor.flush_quiet_groups)

    @app.timer(interval=max(1.0, min(cfg.step_wait_s / 4, 30.0)), name=f"{NAME}-step-timeout")
    async def judge_steps_timeout():
        await step(processor.flush_stale_steps)

    @app.timer(interval=max(1.0, min(cfg.state_ttl_s / 4, 600.0)), name=f"{NAME}-state-ttl")
    async def judge_state_ttl():
        await step(processor.expire_state)


async def _store(app, tables: dict, updates: dict[str, dict]) -> None:
    """Write state to the tables: changelog records sent and acknowledged first, then the local
    store (faust's own table writes go through a buffer its pre-commit flush may not wait for)."""
    import asyncio

    futures, local = [], []
    for name, changes in updates.items():
        table = tables[name]
        changelog = table.changelog_topic.get_topic_name()
        for key, value in changes.items():
            raw_key, raw_value = key.encode(), None if value is None else orjson.dumps(value)
            futures.append(await app.producer.send(changelog, raw_key, raw_value, None, None, None))
            local.append((table, raw_key, raw_value))
    if futures:
        await asyncio.gather(*futures)
    for table, raw_key, raw_value in local:
        if raw_value is None:
            table.data.pop(raw_key, None)
        else:
            table.data[raw_key] = raw_value


def _record(event):
    from streams.judge.processor import SourceRecord

    message = event.message
    return SourceRecord(
        value=event.value,
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        key=event.key,
    )


async def _publish(app, sink, groups_topic, result) -> None:
    """Send the outputs, group members and dead letters, and wait until the broker acknowledged
    them, so the batch's offsets (committed by faust after this returns) never run ahead of them."""
    import asyncio

    from schemas.codec import encode, encode_key
    from streams.dlq import send_dead_letters

    producer = app.producer
    futures = [
        await producer.send(sink.get_topic_name(), encode_key(e), encode(e), None, None, None)
        for e in result.outputs
    ]
    futures += [
        await producer.send(groups_topic.get_topic_name(), group_id.encode(), payload, None, None, None)
        for group_id, payload in result.group_members
    ]
    if futures:
        await asyncio.gather(*futures)
    await send_dead_letters(app, NAME, result.dead_letters)


class BytesKeyed(MutableMapping):
    """A str-keyed, dict-valued view of a faust table stored as raw bytes: keys utf-8 (so the
    changelog key bytes equal the source topic's key bytes, hence the same partition, and recovered
    keys read back), values orjson."""

    def __init__(self, table):
        self.table = table

    def __getitem__(self, key: str):
        return orjson.loads(self.table[key.encode()])

    def __setitem__(self, key: str, value) -> None:
        self.table[key.encode()] = orjson.dumps(value)

    def __delitem__(self, key: str) -> None:
        del self.table[key.encode()]

    def __iter__(self) -> Iterator[str]:
        return (k.decode() if isinstance(k, bytes) else k for k in list(self.table.keys()))

    def __len__(self) -> int:
        return len(self.table)

    def get(self, key: str, default=None):
        raw = self.table.get(key.encode())
        return default if raw is None else orjson.loads(raw)

"""The judge processor: agent events in, judge requests run concurrently, judge events out.

Transport-free: the judge role (`role.py`, on the one batch shell streams/shell.py) and the
benchmark feed it records and publish the `BatchResult` it returns. State is two mutable mappings
of JSON-able dicts, a faust table in the worker (changelog-backed) or a plain dict:

- `state[trajectory_id]`: the rule chosen at `episode.started`, task and domain, the steps kept
  for context / trajectory mode, the steps waiting to fill a step batch, and whether it ended.
- `groups[group_id]`: the ended members of a group-mode group until the group is judged
  (streams/judge/groups.py).

Per batch of records it updates the state in order, collects the calls to make (built by
streams/judge/request_builders.py), runs them all at once (the client's semaphore bounds
concurrency; cache, budget and settlement in streams/judge/calls.py), and returns the events. It
never invents a score: a call that fails, is over budget or cannot be parsed gives
`reward.judge.failed`. A request the budget refused is parked in the state record it came from and
run again once its window reopens (streams/judge/retry.py), by the timer that runs
`flush_stale_steps`; its scores then follow the `budget_paused` events and replace them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, MutableMapping, Sequence
from datetime import datetime

import orjson

from clients.kafka.dead_letters import letter_for
from schemas.events import EpisodeEnded, EpisodeStarted, EventBase, StepRecorded, utc_now
from schemas.records import Record
from streams.batch import BatchResult, decode_record
from streams.judge.budget import SpendBudget
from streams.judge.cache import ReplyCache
from streams.judge.calls import JudgeCalls, JudgeStats, Outcome
from streams.judge.client import JudgeClient
from streams.judge.config import JudgeConfig
from streams.judge.groups import add_member, close_group
from streams.judge.pricing import require_prices
from streams.judge.request_builders import group_request, step_request, trajectory_request
from streams.judge.requests import JudgeRequest
from streams.judge.retry import has_parked, keys_with_parked, park, parked_at, request_from, take_due
from streams.judge.rubrics import RubricCatalog, RubricSet
from streams.judge.selection import JudgeRule, JudgeRules
from streams.judge.state import (
    StagedState,
    as_int,
    group_member,
    new_record,
    raw_updates,
    rule_of,
    step_dict,
)

log = logging.getLogger(__name__)

NAME = "judge"

__all__ = ["JudgeProcessor"]


class JudgeProcessor:
    def __init__(
        self,
        config: JudgeConfig,
        rules: JudgeRules,
        catalog: RubricCatalog,
        client: JudgeClient,
        *,
        budget: SpendBudget | None = None,
        cache: ReplyCache | None = None,
        now: Callable[[], datetime] = utc_now,
        wall: Callable[[], float] = time.time,
    ):
        require_prices(config, [m for m in (getattr(r, "model", None) for r in rules.rules) if m])
        self.config = config
        self.rules = rules
        self.catalog = catalog
        self.client = client
        self.now = now
        self.wall = wall
        # Writes are staged until the caller has published the outputs (see `bind`); with
        # `autocommit` (the default: plain dicts, tests, the bench) they apply at the end of a call.
        self.state = StagedState()
        self.groups = StagedState()
        self.autocommit = True
        self.stats = JudgeStats()
        self.calls = JudgeCalls(
            config,
            client,
            budget or SpendBudget(config.budget_usd_per_hour, config.budget_usd_per_day),
            cache or ReplyCache(config.cache_entries),
            self.stats,
            lambda: self.now(),
        )
        # step mode: trajectories with a part-filled batch -> when its first step arrived (memory
        # only: after a restart such a batch waits for the next step or the episode's end)
        self.pending_since: dict[str, float] = {}

    @property
    def budget(self):
        return self.calls.budget

    @property
    def cache(self):
        return self.calls.cache

    @classmethod
    def from_config(cls, config: JudgeConfig, **kw) -> JudgeProcessor:
        """Rules and rubrics from the files named in `config`; `kw` as for the constructor."""
        rules = JudgeRules.load(config.rules_path)
        return cls(config, rules, RubricCatalog.load(config.rubrics_path), JudgeClient(config), **kw)

    def bind(self, state: MutableMapping, groups: MutableMapping) -> None:
        """Use durable mappings (faust tables, str keys and dict values). Each result then carries
        its state writes in `tables` (raw bytes), for the shell to store after publishing; one entry
        point runs at a time (the shell's lock)."""
        self.state, self.groups = StagedState(state), StagedState(groups)
        self.autocommit = False

    async def _transaction(self, work) -> BatchResult:
        self.state.discard()  # left over from a call that raised: its input will be replayed
        self.groups.discard()
        result = await work
        if self.autocommit:
            self.state.commit()
            self.groups.commit()
        else:
            result.tables = {
                "state": raw_updates(self.state.take()),
                "groups": raw_updates(self.groups.take()),
            }
        return result

    # --- entry points -----------------------------------------------------------------------------

    async def process_records(self, records: Sequence[Record]) -> BatchResult:
        """Decode agent-event records (bad ones become dead letters), then `process_events`."""
        decoded = BatchResult()
        events = [e for e in (decode_record(NAME, r, decoded) for r in records) if e is not None]
        result = await self.process_events(events)
        result.dead.extend(decoded.dead)
        return result

    async def process_events(self, events: Sequence[EventBase]) -> BatchResult:
        return await self._transaction(self._process_events(events))

    async def process_group_records(self, records: Sequence[Record]) -> BatchResult:
        """Group members forwarded by `process_events` (keyed by group id)."""
        return await self._transaction(self._process_group_records(records))

    async def flush_stale_steps(self) -> BatchResult:
        """The role's timer: step mode, judge part-filled batches that have waited `step_wait_s` (a
        slow agent's steps should not wait for the episode to end); and run the budget-paused
        requests whose window has reopened (`retry_paused`)."""

        async def both() -> BatchResult:
            result = await self._flush_stale_steps()
            result.outputs.extend((await self._retry_paused()).outputs)
            return result

        return await self._transaction(both())

    async def retry_paused(self) -> BatchResult:
        """Run the parked (budget-paused) requests whose `retry_at` has passed."""
        return await self._transaction(self._retry_paused())

    async def flush_quiet_groups(self) -> BatchResult:
        """Judge groups whose expected size is unknown or unreached after `group_wait_s` of quiet."""
        return await self._transaction(self._flush_quiet_groups())

    async def expire_state(self) -> BatchResult:
        """Forget trajectories and groups judged more than `state_ttl_s` ago (bounded state). An
        event for one of them after that is treated as new (a late step in step mode is judged)."""
        return await self._transaction(self._expire_state())

    async def _expire_state(self) -> BatchResult:
        cutoff = self.wall() - self.config.state_ttl_s
        for mapping in (self.state, self.groups):
            for key in list(mapping.keys()):
                value = mapping.get(key)
                old = value and value.get("done") and value.get("done_at", cutoff) < cutoff
                if old and not has_parked(value):  # a parked request keeps its record
                    del mapping[key]
        return BatchResult()

    async def _process_events(self, events: Sequence[EventBase]) -> BatchResult:
        result = BatchResult()
        requests: list[JudgeRequest] = []
        for event in events:
            if isinstance(event, EpisodeStarted):
                requests += self._on_started(event, result)
            elif isinstance(event, StepRecorded):
                requests += self._on_step(event)
            elif isinstance(event, EpisodeEnded):
                requests += self._on_ended(event, result)
        result.outputs.extend(await self.run_requests(requests))
        return result

    async def _process_group_records(self, records: Sequence[Record]) -> BatchResult:
        result, requests = BatchResult(), []
        for record in records:
            try:
                member = orjson.loads(record.value)
                requests += self._add_member(member)
            except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                reason = f"bad judge group member: {exc}"
                result.dead.append(letter_for(NAME, record, reason, type(exc).__name__))
        result.outputs.extend(await self.run_requests(requests))
        return result

    async def _flush_stale_steps(self) -> BatchResult:
        requests = []
        now = self.wall()
        for tid, since in list(self.pending_since.items()):
            if now - since < self.config.step_wait_s:
                continue
            self.pending_since.pop(tid, None)
            rec = self.state.get(tid)
            rule = rule_of(rec) if rec else None
            if rule is not None and rec.get("pending"):
                requests += self._drain(tid, rec, rule, final=True)
                self.state[tid] = rec
        return BatchResult(outputs=await self.run_requests(requests))

    async def _retry_paused(self) -> BatchResult:
        now, requests = self.budget.clock(), []
        for mapping in (self.state, self.groups):
            for key in list(keys_with_parked(mapping)):
                rec = mapping.get(key)
                due = take_due(rec, now) if rec else []
                if due:
                    mapping[key] = rec
                    requests += [request_from(entry["request"]) for entry in due]
        self.stats.retried += len(requests)
        return BatchResult(outputs=await self.run_requests(requests))

    async def _flush_quiet_groups(self) -> BatchResult:
        requests = []
        for group_id in list(self.groups.keys()):
            group = self.groups.get(group_id)
            if (
                group
                and not group.get("done")
                and self.wall() - group["last_seen"] >= self.config.group_wait_s
            ):
                requests.append(self._close_group(group_id, group))
        return BatchResult(outputs=await self.run_requests(requests))

    # --- state transitions ------------------------------------------------------------------------

    def _on_started(self, started: EpisodeStarted, result: BatchResult) -> list[JudgeRequest]:
        rec = self.state.get(started.trajectory_id) or new_record()
        if rec.get("decided"):
            return []  # duplicate episode.started
        rule = self.rules.rule_for(started)
        rec.update(decided=True, rule=rule.model_dump() if rule else None)
        if rule is None:
            self.state[started.trajectory_id] = {"decided": True, "rule": None}
            return []
        rec.update(
            task=started.task,
            domain=started.domain,
            group_id=started.group_id,
            expected=rule.group_size or as_int(started.metadata.get("group_size")),
            start_event_id=started.event_id,
        )
        if rule.mode == "step":
            rec["pending"] = sorted(s["i"] for s in rec["steps"])
        if rec.get("ended") is not None:
            requests = self._finish(started.trajectory_id, rec, rule, result)
        elif rule.mode == "step":
            requests = self._drain(started.trajectory_id, rec, rule, final=False)
        else:
            requests = []
        self.state[started.trajectory_id] = rec
        return requests

    def _on_step(self, step: StepRecorded) -> list[JudgeRequest]:
        tid = step.trajectory_id
        rec = self.state.get(tid) or new_record()
        if rec.get("decided") and rec.get("rule") is None:
            return []
        seen = rec.setdefault("seen", [])
        if step.step_index in seen:
            return []  # duplicate
        seen.append(step.step_index)
        rule = rule_of(rec)
        if rec.get("done") and (rule is None or rule.mode != "step"):
            log.info(
                "%s: step %d of %s arrived after it was judged whole; not judged", NAME, step.step_index, tid
            )
            self.state[tid] = rec
            return []
        rec["steps"].append(step_dict(step, self.config.observation_chars))
        requests = []
        if rule is not None and rule.mode == "step":
            rec["pending"].append(step.step_index)
            requests = self._drain(tid, rec, rule, final=bool(rec.get("done")))
        self.state[tid] = rec
        return requests

    def _on_ended(self, ended: EpisodeEnded, result: BatchResult) -> list[JudgeRequest]:
        tid = ended.trajectory_id
        rec = self.state.get(tid) or new_record()
        if (rec.get("decided") and rec.get("rule") is None) or rec.get("ended") is not None:
            return []
        rec["ended"] = {"success": ended.success, "score": ended.score, "event_id": ended.event_id}
        rule = rule_of(rec)
        requests = [] if rule is None else self._finish(tid, rec, rule, result)
        self.state[tid] = rec
        return requests

    def _finish(self, tid: str, rec: dict, rule: JudgeRule, result: BatchResult) -> list[JudgeRequest]:
        """The trajectory ended (and its rule is known): flush steps, or judge / forward it whole."""
        if rule.mode == "step":
            requests = self._drain(tid, rec, rule, final=True)
        elif rule.mode == "group" and rec.get("group_id"):
            member = group_member(tid, rec, self.config.observation_chars * 2)
            result.forwards.append((rec["group_id"].encode(), orjson.dumps(member)))
            requests = []
        else:
            requests = [trajectory_request(tid, rec, self._rubrics(rec, rule), self.config)]
        rec.update(done=True, done_at=self.wall(), steps=[], pending=[])
        return requests

    def _drain(self, tid: str, rec: dict, rule: JudgeRule, final: bool) -> list[JudgeRequest]:
        """Step mode: one request per full batch of pending steps (and the remainder when final)."""
        requests = []
        while rec["pending"] and (final or len(rec["pending"]) >= rule.batch_steps):
            batch, rec["pending"] = rec["pending"][: rule.batch_steps], rec["pending"][rule.batch_steps :]
            requests.append(step_request(tid, rec, rule, batch, self._rubrics(rec, rule), self.config))
        if rec["pending"]:
            self.pending_since.setdefault(tid, self.wall())
        else:
            self.pending_since.pop(tid, None)
        keep = rule.context_steps + len(rec["pending"])
        rec["steps"] = sorted(rec["steps"], key=lambda s: s["i"])[-keep:] if keep else []
        return requests

    # --- requests ---------------------------------------------------------------------------------

    def _rubrics(self, record: dict, rule: JudgeRule) -> RubricSet:
        """The rubrics `rule` names, from the catalogue of the record's (trajectory's or group's) domain."""
        return self.catalog.for_domain(record.get("domain", "generic")).only(rule.rubrics)

    def _add_member(self, member: dict) -> list[JudgeRequest]:
        group = add_member(self.groups, member, self.wall())
        return [] if group is None else [self._close_group(member["group_id"], group)]

    def _close_group(self, group_id: str, group: dict) -> JudgeRequest:
        rule = JudgeRule.model_validate(group["rule"])
        request = group_request(group_id, group, self._rubrics(group, rule), self.config)
        close_group(self.groups, group_id, group, self.wall())
        return request

    # --- calls ------------------------------------------------------------------------------------

    async def run_requests(self, requests: Sequence[JudgeRequest]) -> list[EventBase]:
        if not requests:
            return []
        await self.calls.open()
        outcomes = await asyncio.gather(*(self.calls.run(r) for r in requests))
        for request, outcome in zip(requests, outcomes, strict=True):
            if outcome.paused_until is not None:
                self._park(request, outcome)
        events = [e for outcome in outcomes for e in outcome.events]
        failed = [e for e in events if e.type == "reward.judge.failed"]
        self.stats.failed += len(failed)
        self.stats.scored += len(events) - len(failed)
        _log_failures(failed)
        return events

    def _park(self, request: JudgeRequest, outcome: Outcome) -> None:
        table, key = parked_at(request)
        mapping = self.groups if table == "groups" else self.state
        rec = mapping.get(key) or new_record()
        park(rec, request, outcome.paused_until)
        mapping[key] = rec


# --- helpers --------------------------------------------------------------------------------------


def _log_failures(failed: list) -> None:
    """One line per failure kind per batch (a paused budget must not flood the log), naming the
    first trajectory and step affected."""
    by_kind: dict[str, list] = {}
    for event in failed:
        by_kind.setdefault(event.kind, []).append(event)
    for kind, events in by_kind.items():
        first = events[0]
        log.warning(
            "%s: %d target(s) not judged (%s), e.g. trajectory %s step %s: %s",
            NAME,
            len(events),
            kind,
            first.trajectory_id,
            first.step_index,
            first.reason,
        )

"""The judge processor: agent events in, judge requests run concurrently, judge events out.

Transport-free: the judge role (`role.py`, on the one batch shell streams/shell.py) and the
benchmark feed it records and publish the `BatchResult` it returns. State is two mutable mappings
of JSON-able dicts, a faust table in the worker (changelog-backed) or a plain dict:

- `state[trajectory_id]`: the rule chosen at `episode.started`, task and domain, the steps kept
  for context / trajectory mode, the steps waiting to fill a step batch, and whether it ended.
- `groups[group_id]`: the ended members of a group-mode group until the group is judged.

Per batch of records it updates the state in order, collects the calls to make, runs them all at
once (the client's semaphore bounds concurrency), and returns the events. It never invents a
score: a call that fails, is over budget or cannot be parsed gives `reward.judge.failed`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import orjson

from schemas.codec import decode
from schemas.errors import DecodeError
from schemas.events import EpisodeEnded, EpisodeStarted, EventBase, StepRecorded, utc_now
from schemas.records import Record
from streams.batch import BatchResult, letter_for
from streams.judge.budget import SpendBudget
from streams.judge.cache import ReplyCache, content_key
from streams.judge.client import JudgeCallError, JudgeClient
from streams.judge.config import JudgeConfig
from streams.judge.parse import ParseError
from streams.judge.pricing import call_cost
from streams.judge.prompt import group_prompt, step_prompt, trajectory_prompt
from streams.judge.rubrics import RubricCatalog
from streams.judge.scoring import CallMeta, JudgeRequest, Target, failure_events, reply_events
from streams.judge.selection import JudgeRule, JudgeRules
from streams.judge.state import (
    StagedState,
    as_int,
    group_member,
    new_record,
    raw_updates,
    rule_of,
    step_dict,
    step_view,
    trajectory_view,
)

log = logging.getLogger(__name__)

NAME = "judge"
EXPECTED_OUTPUT_TOKENS = 120  # per target, for the budget reservation only


@dataclass
class JudgeStats:
    calls: int = 0
    cache_hits: int = 0
    scored: int = 0
    failed: int = 0
    budget_paused: int = 0
    cost_usd: float = 0.0
    overhead_s: float = 0.0  # time spent in the processor itself around calls (not awaiting the model)


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
        self.config = config
        self.rules = rules
        self.catalog = catalog
        self.client = client
        self.budget = budget or SpendBudget(config.budget_usd_per_hour, config.budget_usd_per_day)
        self.cache = cache or ReplyCache(config.cache_entries)
        self.now = now
        self.wall = wall
        # Writes are staged until the caller has published the outputs (see `bind`); with
        # `autocommit` (the default: plain dicts, tests, the bench) they apply at the end of a call.
        self.state = StagedState()
        self.groups = StagedState()
        self.autocommit = True
        self.stats = JudgeStats()
        self._inflight: dict[str, asyncio.Future] = {}
        # step mode: trajectories with a part-filled batch -> when its first step arrived (memory
        # only: after a restart such a batch waits for the next step or the episode's end)
        self.pending_since: dict[str, float] = {}

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
        events, letters = [], []
        for record in records:
            try:
                events.append(decode(record.value or b""))
            except DecodeError as exc:
                letters.append(letter_for(NAME, record, exc.reason, "DecodeError"))
        result = await self.process_events(events)
        result.dead.extend(letters)
        return result

    async def process_events(self, events: Sequence[EventBase]) -> BatchResult:
        return await self._transaction(self._process_events(events))

    async def process_group_records(self, records: Sequence[Record]) -> BatchResult:
        """Group members forwarded by `process_events` (keyed by group id)."""
        return await self._transaction(self._process_group_records(records))

    async def flush_stale_steps(self) -> BatchResult:
        """Step mode: judge part-filled batches that have waited `step_wait_s` (a slow agent's steps
        should not wait for the episode to end)."""
        return await self._transaction(self._flush_stale_steps())

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
                if value and value.get("done") and value.get("done_at", cutoff) < cutoff:
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
            requests = [self._trajectory_request(tid, rec, rule)]
        rec.update(done=True, done_at=self.wall(), steps=[], pending=[])
        return requests

    def _drain(self, tid: str, rec: dict, rule: JudgeRule, final: bool) -> list[JudgeRequest]:
        """Step mode: one request per full batch of pending steps (and the remainder when final)."""
        requests = []
        while rec["pending"] and (final or len(rec["pending"]) >= rule.batch_steps):
            batch, rec["pending"] = rec["pending"][: rule.batch_steps], rec["pending"][rule.batch_steps :]
            requests.append(self._step_request(tid, rec, rule, batch))
        if rec["pending"]:
            self.pending_since.setdefault(tid, self.wall())
        else:
            self.pending_since.pop(tid, None)
        keep = rule.context_steps + len(rec["pending"])
        rec["steps"] = sorted(rec["steps"], key=lambda s: s["i"])[-keep:] if keep else []
        return requests

    # --- requests ---------------------------------------------------------------------------------

    def _rubrics(self, domain: str, rule: JudgeRule):
        return self.catalog.for_domain(domain).only(rule.rubrics)

    def _step_request(self, tid: str, rec: dict, rule: JudgeRule, indices: list[int]) -> JudgeRequest:
        by_index = {s["i"]: s for s in rec["steps"]}
        steps = [by_index[i] for i in indices]
        first = min(indices)
        context = [s for s in sorted(rec["steps"], key=lambda s: s["i"]) if s["i"] < first][
            -rule.context_steps :
        ]
        rubrics = self._rubrics(rec.get("domain", "generic"), rule)
        prompt = step_prompt(
            rec.get("task", ""),
            rubrics,
            [step_view(s) for s in steps],
            [step_view(s) for s in context] if rule.context_steps else [],
            self.config.observation_chars,
        )
        targets = [Target(tid, s["eid"], step_index=s["i"]) for s in steps]
        return JudgeRequest("step", prompt, rubrics, targets, model=self.config.model)

    def _trajectory_request(self, tid: str, rec: dict, rule: JudgeRule) -> JudgeRequest:
        rubrics = self._rubrics(rec.get("domain", "generic"), rule)
        view = trajectory_view("T1", rec["steps"], rec.get("ended"))
        prompt = trajectory_prompt(rec.get("task", ""), rubrics, view, self.config.observation_chars * 4)
        target = Target(tid, rec["ended"]["event_id"], label="T1", group_id=rec.get("group_id"))
        return JudgeRequest("trajectory", prompt, rubrics, [target], model=self.config.model)

    def _add_member(self, member: dict) -> list[JudgeRequest]:
        group_id = member["group_id"]
        group = self.groups.get(group_id) or {
            "task": member.get("task", ""),
            "domain": member.get("domain", "generic"),
            "rule": member["rule"],
            "expected": member.get("expected"),
            "members": {},
            "done": False,
        }
        if member["trajectory_id"] in group.get("judged", ()):
            return []  # forwarded again after a restart: already judged with its group
        if group["done"]:
            group = {**group, "members": {}, "done": False}  # a late member: judged on its own
        group["members"][member["trajectory_id"]] = member
        group["last_seen"] = self.wall()
        expected = group.get("expected")
        if expected and len(group["members"]) >= expected:
            request = self._close_group(group_id, group)
            return [request]
        self.groups[group_id] = group
        return []

    def _close_group(self, group_id: str, group: dict) -> JudgeRequest:
        rule = JudgeRule.model_validate(group["rule"])
        rubrics = self._rubrics(group.get("domain", "generic"), rule)
        members = [group["members"][k] for k in sorted(group["members"])]
        labels = [f"T{i + 1}" for i in range(len(members))]
        views = [
            trajectory_view(lbl, m["steps"], m.get("ended")) for lbl, m in zip(labels, members, strict=True)
        ]
        prompt = group_prompt(group.get("task", ""), rubrics, views, self.config.observation_chars * 2)
        targets = [
            Target(m["trajectory_id"], m["ended"]["event_id"], label=lbl, group_id=group_id)
            for lbl, m in zip(labels, members, strict=True)
        ]
        judged = sorted({*group.get("judged", ()), *group["members"]})
        self.groups[group_id] = {
            **group,
            "members": {},
            "done": True,
            "judged": judged,
            "done_at": self.wall(),
        }
        return JudgeRequest("group", prompt, rubrics, targets, model=self.config.model)

    # --- calls ------------------------------------------------------------------------------------

    async def run_requests(self, requests: Sequence[JudgeRequest]) -> list[EventBase]:
        if not requests:
            return []
        batches = await asyncio.gather(*(self._run(r) for r in requests))
        events = [e for batch in batches for e in batch]
        failed = [e for e in events if e.type == "reward.judge.failed"]
        self.stats.failed += len(failed)
        self.stats.scored += len(events) - len(failed)
        _log_failures(failed)
        return events

    async def _run(self, request: JudgeRequest) -> list[EventBase]:
        key = content_key(
            request.prompt.version, self.config.model, request.prompt.system, request.prompt.user
        )
        text = await self._cached_text(key)
        if text is not None:
            self.stats.cache_hits += 1
            meta = CallMeta(self.config.model, request.prompt.version, cached=True)
            return reply_events(request, text, meta, self.now())
        future = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            events, usable_text = await self._call(request)
            if usable_text is not None:
                self.cache.put(key, usable_text)
        finally:
            self._inflight.pop(key, None)
            future.set_result(None)  # waiters on the same content read the cache now
        return events

    async def _cached_text(self, key: str) -> str | None:
        text = self.cache.get(key)
        if text is None and key in self._inflight:
            await asyncio.shield(self._inflight[key])
            text = self.cache.get(key)
        return text

    async def _call(self, request: JudgeRequest) -> tuple[list[EventBase], str | None]:
        estimate = self._estimate(request)
        retry_at = self.budget.reserve(estimate)
        if retry_at is not None:
            self.stats.budget_paused += 1
            reason = f"judge spend budget reached; paused until {retry_at.isoformat()}"
            return failure_events(request, reason, "budget_paused", self.now(), retry_at=retry_at), None
        self.stats.calls += 1
        try:
            result = await self.client.complete(request.prompt)
        except JudgeCallError as exc:
            self.budget.settle(estimate, 0.0)
            return failure_events(request, exc.reason, exc.kind, self.now(), attempts=exc.attempts), None
        cost = call_cost(
            self.config, result.model or self.config.model, result.input_tokens, result.output_tokens
        )
        self.budget.settle(estimate, cost)
        self.stats.cost_usd += cost
        meta = CallMeta(
            result.model or self.config.model,
            request.prompt.version,
            result.input_tokens,
            result.output_tokens,
            cost,
            result.latency_ms,
        )
        try:
            events = reply_events(request, result.text, meta, self.now())
        except ParseError as exc:
            return failure_events(request, str(exc), "parse", self.now(), result.attempts, meta=meta), None
        usable = any(e.type != "reward.judge.failed" for e in events)
        return events, (result.text if usable else None)

    def _estimate(self, request: JudgeRequest) -> float:
        chars = len(request.prompt.system) + len(request.prompt.user)
        return call_cost(
            self.config, self.config.model, chars // 4, EXPECTED_OUTPUT_TOKENS * len(request.targets)
        )


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

"""OpenHands event streams (All-Hands-AI/OpenHands, openhands/events/serialization/event.py `event_to_dict`).

Accepted containers, as OpenHands writes them:
- a JSON array of events (`--save-trajectory-path`, `<sid>.json`; tests/runtime/trajs/*.json),
- `{"trajectory": [events]}` (the server's GET /trajectory, the UI's "download trajectory"),
- JSON Lines with one event per line (the session's events/<id>.json files, concatenated),
- evaluation output JSONL (evaluation/benchmarks/*/run_infer.py, output.jsonl): one instance per line,
  `{instance_id, instruction, history: [events], metadata{agent_class, llm_config{model}},
  test_result{git_patch, report?}, metrics, error}` -> one episode per line.

An event is `{id, timestamp, source, message, cause?, action|observation, args|content+extras,
tool_call_metadata?, llm_metrics?}`.

Mapping:
- task = the first user `message` action's `args.content` (or the record's `instruction`).
- one step per agent action except the bookkeeping ones (`system`, `recall`, `condensation`,
  `change_agent_state`, `null`, ...): run -> bash, run_ipython -> ipython, read -> read_file, write ->
  write_file, edit -> edit_file (or read_file/write_file for the editor's view/create), browse /
  browse_interactive -> browse_url, call_tool_mcp -> its tool name, think, finish, delegate, and agent
  `message` -> message. params = `args` without the bookkeeping keys and None values; thought =
  `args.thought`.
- the observation is the event whose `cause` is the action's id (else the next observation);
  observation = its `content`; exit_code = `extras.metadata.exit_code` (`extras.exit_code` in older
  versions; OpenHands uses -1 for "no exit code yet", kept as logged); error = the content of an
  `error` observation, or of an editor observation starting with "ERROR:". An `error` observation
  with no action (a tool call OpenHands refused) is a step of its own with tool "invalid". Missing
  params are filled from the model's tool call in `tool_call_metadata` (older versions dropped some).
  A user message after an agent `message` step is that step's observation (the user's reply);
  other later user messages are kept in `metadata.later_user_messages`.
- timestamps are the actions' own (`timestamp`; OpenHands writes local time without a zone, read as
  UTC and flagged in metadata). Token counts per step come from `tool_call_metadata.model_response.usage`
  (counted once per model response).
- outcome, first rule that applies: `test_result.report.resolved` (evaluation output; score 1.0/0.0);
  `finish.args.task_completed` ("true" -> success); a `finish` action -> success (the agent declared
  the task done) unless the agent state ended in "error"; otherwise success False, outcome unknown.
  An error that says a limit was hit (maximum iterations, budget) marks the episode truncated.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from producers.adapters.contract import Document, EpisodeDraft, Rejection, StepDraft
from producers.adapters.fields import (
    as_int,
    describe,
    json_args,
    non_negative,
    parse_timestamp,
    shape_of,
    text_of,
)
from producers.adapters.tools import normalise_tool
from producers.errors import AdapterError

name = "openhands"

_SKIPPED_ACTIONS = {
    "system", "recall", "condensation", "condensation_request", "change_agent_state", "null",
    "pause", "resume", "stop", "start", "reject", "loop_recovery",
}  # fmt: skip
_NOISE_ARGS = {
    "thought", "blocking", "hidden", "confirmation_state", "security_risk", "impl_source", "is_static",
    "wait_for_response", "image_urls", "file_urls", "include_extra", "reasoning_content",
    "translated_ipython_code",
}  # fmt: skip
_ACTION_TOOLS = {"run": "bash", "run_ipython": "ipython", "read": "read_file", "write": "write_file"}


def _is_event(value: Any) -> bool:
    return isinstance(value, dict) and ("action" in value or "observation" in value) and "source" in value


def detect(doc: Document) -> float:
    items = _containers(doc)
    if items is None:
        return 0.0
    return 0.95 if items else 0.0


def _containers(doc: Document) -> list | None:
    """The raw episodes of the file (lists of events, or eval records), or None if not OpenHands."""
    value = doc.value
    if doc.kind == "json" and isinstance(value, dict) and isinstance(value.get("trajectory"), list):
        value = value["trajectory"]
    if doc.kind == "json" and isinstance(value, dict) and _is_eval_record(value):
        return [value]
    if doc.kind == "json" and isinstance(value, list) and value and _is_event(value[0]):
        return [value]
    if doc.kind == "jsonl" and doc.records:
        if all(_is_eval_record(r) for r in doc.records):
            return list(doc.records)
        if _is_event(doc.records[0]):
            return [list(doc.records)]
    return None


def _is_eval_record(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("history"), list) and "instance_id" in value


def parse(doc: Document) -> Iterator[EpisodeDraft | Rejection]:
    containers = _containers(doc)
    if containers is None:
        got = shape_of(doc)
        raise AdapterError(
            f"{doc.path}: not an OpenHands event stream: expected a JSON array of events with "
            f"'action'/'observation' and 'source', got {got}"
        )
    for index, container in enumerate(containers):
        where = (
            f"line {doc.lines[index]}" if doc.kind == "jsonl" and isinstance(container, dict) else "events"
        )
        try:
            if isinstance(container, dict):
                yield _eval_episode(doc, container, key=str(index), where=where)
            else:
                yield _episode(doc, container, key="0", record={}, where=where)
        except AdapterError as exc:
            yield Rejection(f"{doc.path}: {where}", str(exc), container)


def _eval_episode(doc: Document, record: dict, key: str, where: str) -> EpisodeDraft:
    draft = _episode(doc, record["history"], key=key, record=record, where=f"{where}: history")
    report = _test_report(record.get("test_result"))
    if isinstance(report.get("resolved"), bool):
        draft.success = report["resolved"]
        draft.score = 1.0 if report["resolved"] else 0.0
        draft.outcome_source = "test_result.report.resolved"
    if record.get("error"):
        draft.error = str(record["error"])
        draft.truncated = draft.truncated or _is_limit(draft.error)
    _record_tokens(draft, record.get("metrics"))
    return draft


def _test_report(test_result: Any) -> dict:
    if not isinstance(test_result, dict):
        return {}
    report = test_result.get("report")
    return report if isinstance(report, dict) else {}


def _episode(doc: Document, events: list, key: str, record: dict, where: str) -> EpisodeDraft:
    for i, event in enumerate(events):
        if not _is_event(event):
            raise AdapterError(
                f"{doc.path}: {where}[{i}] is not an OpenHands event "
                f"(needs 'source' and 'action' or 'observation'), got {describe(event)}"
            )
    state = _Walk(events)
    metadata = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    draft = EpisodeDraft(
        key=key,
        task_id=str(record.get("instance_id") or doc.stem),
        task=str(record.get("instruction") or state.task),
        domain="coding",
        agent=_agent(metadata, events),
        model=_model(metadata, events),
        steps=state.steps,
        started_at=state.first_time,
        ended_at=state.last_time,
        metadata=_metadata(record, metadata, state),
    )
    _apply_outcome(draft, state)
    return draft


class _Walk:
    """One pass over the events: steps paired with observations, the task, the final state."""

    def __init__(self, events: list[dict]):
        self.steps: list[StepDraft] = []
        self.task = ""
        self.user_messages: list[str] = []
        self.finish: dict | None = None
        self.agent_state = ""
        self.state_reason = ""
        self.naive = False
        self.skipped: dict[str, int] = {}
        self.first_time = None
        self.last_time = None
        self._by_id: dict[Any, StepDraft] = {}
        self._pending: list[StepDraft] = []
        self._seen_responses: set[str] = set()
        self._last_message_step: StepDraft | None = None
        for event in events:
            self._stamp(event)
            if "action" in event:
                self._action(event)
            else:
                self._observation(event)

    def _stamp(self, event: dict) -> None:
        when, naive = parse_timestamp(event.get("timestamp"))
        self.naive = self.naive or naive
        if self.first_time is None and when is not None:
            self.first_time = when
        self.last_time = when or self.last_time

    def _action(self, event: dict) -> None:
        kind = str(event.get("action"))
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        if event.get("source") == "user" and kind == "message":
            self._user_message(args.get("content", event.get("message", "")))
            return
        if event.get("source") != "agent" or kind in _SKIPPED_ACTIONS:
            self.skipped[kind] = self.skipped.get(kind, 0) + 1
            return
        step = self._step(event, kind, args)
        self.steps.append(step)
        if kind == "finish":
            self.finish = args
        if event.get("id") is not None:
            self._by_id[event["id"]] = step
        self._pending.append(step)
        self._last_message_step = step if kind == "message" else None

    def _user_message(self, content: Any) -> None:
        text = text_of(content)
        if not self.task:
            self.task = text
        elif self._last_message_step is not None and not self._last_message_step.observation:
            self._last_message_step.observation = text
        else:
            self.user_messages.append(text)  # mid-task instructions: kept, they are not agent steps
        self._last_message_step = None

    def _step(self, event: dict, kind: str, args: dict) -> StepDraft:
        params = {k: v for k, v in args.items() if k not in _NOISE_ARGS and v not in (None, "")}
        for key, value in _call_arguments(event.get("tool_call_metadata")).items():
            # older OpenHands versions left some of the model's arguments out of `args` (e.g. an
            # editor `create` as an edit with empty content): fill the gaps from the tool call itself
            if key not in _NOISE_ARGS and params.get(key) in (None, "") and value not in (None, ""):
                params[key] = value
        if params.get("is_input") is False:
            params.pop("is_input")
        if kind == "edit" and params.get("command"):  # editor commands: start/end belong to LLM edits
            params.pop("start", None)
            params.pop("end", None)
        thought = args.get("thought") if isinstance(args.get("thought"), str) else ""
        if kind == "think":
            params.pop("thought", None)
        step = StepDraft(
            tool=_tool(kind, params),
            params=params,
            thought=thought,
            timestamp=parse_timestamp(event.get("timestamp"))[0],
        )
        step.input_tokens, step.output_tokens = self._usage(event.get("tool_call_metadata"))
        if kind == "message":
            step.params = {"content": text_of(args.get("content", event.get("message", "")))}
        return step

    def _usage(self, metadata: Any) -> tuple[int | None, int | None]:
        response = metadata.get("model_response") if isinstance(metadata, dict) else None
        if not isinstance(response, dict) or not isinstance(response.get("usage"), dict):
            return None, None
        response_id = str(response.get("id", ""))
        if response_id in self._seen_responses:
            return None, None  # several tool calls from one response: count its tokens once
        self._seen_responses.add(response_id)
        usage = response["usage"]
        return non_negative(usage.get("prompt_tokens")), non_negative(usage.get("completion_tokens"))

    def _observation(self, event: dict) -> None:
        kind = str(event.get("observation"))
        extras = event.get("extras") if isinstance(event.get("extras"), dict) else {}
        if kind == "agent_state_changed":
            self.agent_state = str(extras.get("agent_state", ""))
            self.state_reason = str(extras.get("reason", "") or "")
            return
        step = self._by_id.get(event.get("cause")) if event.get("cause") is not None else None
        if step is None and event.get("cause") is None and self._pending:
            step = self._pending[0]
        if step is None and kind == "error" and event.get("cause") is None:
            step = self._rejected_call(event)  # a tool call OpenHands refused before it became an action
        if step is None or kind in ("null", "recall"):
            self.skipped[f"observation:{kind}"] = self.skipped.get(f"observation:{kind}", 0) + 1
            return
        if step in self._pending:
            self._pending.remove(step)
        content = text_of(event.get("content", event.get("message", "")))
        step.observation = content
        step.exit_code = _exit_code(extras)
        if kind == "error" or (kind in ("edit", "read", "write") and content.lstrip().startswith("ERROR:")):
            step.error = content.strip()[:2000]

    def _rejected_call(self, event: dict) -> StepDraft:
        step = StepDraft(tool="invalid", timestamp=parse_timestamp(event.get("timestamp"))[0])
        self.steps.append(step)
        self._last_message_step = None
        return step


def _call_arguments(metadata: Any) -> dict:
    """The arguments of the model's tool call behind an action (`tool_call_metadata`), decoded."""
    if not isinstance(metadata, dict) or not isinstance(metadata.get("model_response"), dict):
        return {}
    for choice in metadata["model_response"].get("choices") or []:
        message = choice.get("message") if isinstance(choice, dict) else None
        for call in (message or {}).get("tool_calls") or []:
            if isinstance(call, dict) and call.get("id") == metadata.get("tool_call_id"):
                return json_args((call.get("function") or {}).get("arguments"))[0]
    return {}


def _tool(kind: str, args: dict) -> str:
    if kind in _ACTION_TOOLS:
        return _ACTION_TOOLS[kind]
    if kind == "edit":
        command = str(args.get("command") or "")
        return {"view": "read_file", "create": "write_file"}.get(command, "edit_file")
    if kind == "call_tool_mcp":
        return normalise_tool(str(args.get("name") or "mcp"))
    return normalise_tool(kind)


def _exit_code(extras: dict) -> int | None:
    metadata = extras.get("metadata")
    if isinstance(metadata, dict) and "exit_code" in metadata:
        return as_int(metadata["exit_code"])
    return as_int(extras.get("exit_code"))


def _agent(metadata: dict, events: list[dict]) -> str:
    agent_class = metadata.get("agent_class")
    for event in events:
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        if not agent_class and event.get("action") == "system":
            agent_class = args.get("agent_class")
    return f"openhands/{agent_class}" if agent_class else "openhands"


def _model(metadata: dict, events: list[dict]) -> str:
    config = metadata.get("llm_config") if isinstance(metadata.get("llm_config"), dict) else {}
    if config.get("model"):
        return str(config["model"])
    for event in events:
        meta = event.get("tool_call_metadata")
        response = meta.get("model_response") if isinstance(meta, dict) else None
        if isinstance(response, dict) and response.get("model"):
            return str(response["model"])
    for event in events:
        usage = (event.get("llm_metrics") or {}).get("accumulated_token_usage") or {}
        if isinstance(usage, dict) and usage.get("model") not in (None, "", "default"):
            return str(usage["model"])
    return ""


def _metadata(record: dict, metadata: dict, state: _Walk) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if state.skipped:
        meta["skipped_events"] = dict(sorted(state.skipped.items()))
    if state.agent_state:
        meta["final_agent_state"] = state.agent_state
    if state.user_messages:
        meta["later_user_messages"] = state.user_messages
    if state.naive:
        meta["naive_timestamps_read_as_utc"] = True
    if isinstance(record.get("test_result"), dict):
        meta["test_result"] = record["test_result"]
    for key in ("agent_class", "max_iterations", "openhands_version", "dataset"):
        if metadata.get(key) is not None:
            meta[key] = metadata[key]
    return meta


def _apply_outcome(draft: EpisodeDraft, state: _Walk) -> None:
    step_tokens = [s for s in draft.steps if s.input_tokens is not None]
    if step_tokens:
        draft.input_tokens = sum(s.input_tokens or 0 for s in step_tokens)
        draft.output_tokens = sum(s.output_tokens or 0 for s in step_tokens)
    if state.agent_state == "error":
        draft.error = state.state_reason or "agent state: error"
        draft.truncated = _is_limit(draft.error)
    if state.finish is None:
        draft.terminated = False
        return
    completed = state.finish.get("task_completed")
    if isinstance(completed, str) and completed:
        draft.success = completed == "true"
        draft.outcome_source = "finish.task_completed"
    else:
        draft.success = state.agent_state != "error"
        draft.outcome_source = "finish_action"


def _is_limit(error: str) -> bool:
    """Whether an OpenHands error means a budget ran out (then the episode is truncated, not failed)."""
    lowered = error.lower()
    return any(m in lowered for m in ("maximum iteration", "max_iterations", "budget", "context window"))


def _record_tokens(draft: EpisodeDraft, metrics: Any) -> None:
    usage = metrics.get("accumulated_token_usage") if isinstance(metrics, dict) else None
    if isinstance(usage, dict):
        draft.input_tokens = non_negative(usage.get("prompt_tokens"))
        draft.output_tokens = non_negative(usage.get("completion_tokens"))
    cost = metrics.get("accumulated_cost") if isinstance(metrics, dict) else None
    if isinstance(cost, int | float) and cost >= 0:
        draft.cost_usd = float(cost)

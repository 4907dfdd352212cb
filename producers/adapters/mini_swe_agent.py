"""mini-swe-agent `.traj.json` files (SWE-agent/mini-swe-agent: `DefaultAgent.serialize`,
docs/usage/output_files.md).

One JSON object: `info` (`exit_status`, `submission`, `model_stats{instance_cost, api_calls}`,
`config{agent, model{model_name}, environment, ...}`, `mini_version`), `messages` (the chat, OpenAI
format plus an `extra` dict per message) and `trajectory_format` ("mini-swe-agent-1" for v1,
"mini-swe-agent-1.1" for v2); the SWE-bench runner adds a top-level `instance_id`.

Two message styles are read:
- v2 tool calls: an assistant message with `tool_calls` and `extra.actions[{command, tool_call_id}]`,
  answered by `role: "tool"` messages with the same `tool_call_id` and `extra.returncode`/`timestamp`.
- text actions (v1, and v2 `*_textbased` models): the assistant `content` holds one fenced
  ```bash / ```mswea_bash_command block; the next user message is the observation
  (`<returncode>N</returncode><output>...` in v1, or `extra.returncode` in v2).
The final `role: "exit"` message (v2) carries exit_status/submission and is not a step.

Mapping: one step per action; tool `bash`, or `submit` for the completion command (echo
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT / MINI_SWE_AGENT_FINAL_OUTPUT); an assistant message with no
parsable action (format error) is a step with tool "invalid" and the harness's complaint as error.
Timestamps come from `extra.timestamp` (unix seconds) when present. Token counts come from
`extra.response.usage` when the model's raw response was saved. Outcome: success iff
`info.exit_status == "Submitted"`; LimitsExceeded/TimeExceeded set truncated; score stays None.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from producers.adapters.contract import Document, EpisodeDraft, Rejection, StepDraft
from producers.adapters.fields import as_int, describe, non_negative, parse_timestamp, text_of
from producers.errors import AdapterError

name = "mini-swe-agent"

_ACTION_BLOCK = re.compile(r"```(?:mswea_bash_command|bash)\s*\n(.*?)\n```", re.DOTALL)
_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
_SUBMIT_MARKERS = ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "MINI_SWE_AGENT_FINAL_OUTPUT")
_LIMIT_STATUSES = {"LimitsExceeded", "TimeExceeded"}


def detect(doc: Document) -> float:
    value = doc.value if doc.kind == "json" else None
    if not isinstance(value, dict) or not isinstance(value.get("messages"), list):
        return 0.0
    if str(value.get("trajectory_format", "")).startswith("mini-swe-agent"):
        return 1.0
    info = value.get("info")
    if isinstance(info, dict) and ("mini_version" in info or "exit_status" in info):
        return 0.9
    return 0.0


def parse(doc: Document) -> Iterator[EpisodeDraft | Rejection]:
    value = doc.value
    if not isinstance(value, dict):
        raise AdapterError(f"{doc.path}: a mini-swe-agent trajectory is a JSON object, got {describe(value)}")
    messages = value.get("messages")
    if not isinstance(messages, list):
        raise AdapterError(f"{doc.path}: messages must be a list, got {describe(messages)}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise AdapterError(
                f"{doc.path}: messages[{i}] must be an object with a role, got {describe(message)}"
            )
    info = value.get("info") if isinstance(value.get("info"), dict) else {}
    steps = _steps(messages)
    draft = EpisodeDraft(
        key="0",
        task_id=str(value.get("instance_id") or doc.stem),
        task=_task(messages),
        domain="coding",
        agent="mini-swe-agent",
        model=_model_name(info),
        steps=steps,
        metadata=_metadata(value, info),
    )
    _apply_outcome(draft, info)
    yield draft


def _task(messages: list[dict]) -> str:
    for message in messages:
        if message["role"] == "user":
            return text_of(message.get("content"))
    return ""


def _model_name(info: dict) -> str:
    config = info.get("config") if isinstance(info.get("config"), dict) else {}
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    return str(model.get("model_name") or "")


def _steps(messages: list[dict]) -> list[StepDraft]:
    """Steps from the chat (timestamps are unix seconds, so never naive)."""
    steps: list[StepDraft] = []
    tool_results = {
        m.get("tool_call_id"): m for m in messages if m["role"] == "tool" and m.get("tool_call_id")
    }
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        extra = message.get("extra") if isinstance(message.get("extra"), dict) else {}
        content = text_of(message.get("content"))
        actions = _actions(message, extra, content)
        thought = _ACTION_BLOCK.sub("", content).strip()
        when = parse_timestamp(extra.get("timestamp"))[0]
        tokens = _usage(extra)
        if not actions:
            steps.append(_invalid_step(thought, _next_user(messages, index), when))
            continue
        for n, action in enumerate(actions):
            result = (
                tool_results.get(action.get("tool_call_id"))
                or _next_user(messages, index, skip=n)
                or _exit_message(messages, index)
            )
            step = _action_step(action, result, thought if n == 0 else "", when)
            if n == 0:
                step.input_tokens, step.output_tokens = tokens
            steps.append(step)
    return steps


def _actions(message: dict, extra: dict, content: str) -> list[dict]:
    actions = extra.get("actions")
    if isinstance(actions, list) and actions:
        return [a for a in actions if isinstance(a, dict)]
    if message.get("tool_calls"):
        return []  # tool calls the harness could not parse: a format error follows
    return [{"command": block.strip()} for block in _ACTION_BLOCK.findall(content)][:1]


def _next_user(messages: list[dict], index: int, skip: int = 0) -> dict | None:
    """The `skip`-th user/tool message after `index`, before the next assistant message."""
    seen = 0
    for message in messages[index + 1 :]:
        if message["role"] == "assistant":
            return None
        if message["role"] in ("user", "tool"):
            if seen == skip:
                return message
            seen += 1
    return None


def _exit_message(messages: list[dict], index: int) -> dict | None:
    """The final `exit` message right after `index` (v2: its content is the submission)."""
    following = messages[index + 1 : index + 2]
    return following[0] if following and following[0]["role"] == "exit" else None


def _action_step(action: dict, result: dict | None, thought: str, when) -> StepDraft:
    command = str(action.get("command", ""))
    extra = (result or {}).get("extra") if isinstance((result or {}).get("extra"), dict) else {}
    observation = text_of((result or {}).get("content"))
    exit_code = as_int(extra.get("returncode"))
    if exit_code is None:
        match = _RETURNCODE.search(observation)
        exit_code = int(match.group(1)) if match else None
    exception = extra.get("exception_info")
    return StepDraft(
        tool="submit" if any(marker in command for marker in _SUBMIT_MARKERS) else "bash",
        params={"command": command},
        thought=thought,
        observation=observation,
        exit_code=exit_code,
        error=str(exception) if exception else None,
        timestamp=when or parse_timestamp(extra.get("timestamp"))[0],
    )


def _invalid_step(thought: str, feedback: dict | None, when) -> StepDraft:
    extra = (feedback or {}).get("extra") if isinstance((feedback or {}).get("extra"), dict) else {}
    complaint = text_of((feedback or {}).get("content"))
    kind = extra.get("interrupt_type") or "FormatError"
    return StepDraft(
        tool="invalid",
        thought=thought,
        observation=complaint,
        error=f"{kind}: the response held no executable action",
        timestamp=when,
    )


def _usage(extra: dict) -> tuple[int | None, int | None]:
    response = extra.get("response") if isinstance(extra.get("response"), dict) else {}
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    return non_negative(usage.get("prompt_tokens")), non_negative(usage.get("completion_tokens"))


def _metadata(value: dict, info: dict) -> dict[str, Any]:
    config = info.get("config") if isinstance(info.get("config"), dict) else {}
    meta = {
        "trajectory_format": value.get("trajectory_format"),
        "mini_version": info.get("mini_version"),
        "exit_status": info.get("exit_status"),
        "submission": info.get("submission"),
        "model_stats": info.get("model_stats"),
        "agent_type": config.get("agent_type"),
        "environment_type": config.get("environment_type"),
    }
    return {k: v for k, v in meta.items() if v is not None}


def _apply_outcome(draft: EpisodeDraft, info: dict) -> None:
    stats = info.get("model_stats") if isinstance(info.get("model_stats"), dict) else {}
    cost = stats.get("instance_cost")
    draft.cost_usd = float(cost) if isinstance(cost, int | float) and cost >= 0 else None
    step_tokens = [(s.input_tokens, s.output_tokens) for s in draft.steps if s.input_tokens is not None]
    if step_tokens:
        draft.input_tokens = sum(t[0] or 0 for t in step_tokens)
        draft.output_tokens = sum(t[1] or 0 for t in step_tokens)
    status = info.get("exit_status")
    if not isinstance(status, str) or not status:
        draft.outcome_source, draft.terminated = "unknown", False
        return
    draft.outcome_source = "info.exit_status"
    draft.success = status == "Submitted"
    draft.truncated = status in _LIMIT_STATUSES
    draft.terminated = not draft.truncated
    if not draft.success and not draft.truncated:
        draft.error = f"exit_status={status}"

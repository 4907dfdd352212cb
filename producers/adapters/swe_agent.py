"""SWE-agent `.traj` files (SWE-agent/SWE-agent, `DefaultAgent.get_trajectory_data` / `save_trajectory`).

The file is one JSON object: `trajectory` (a list of steps `{action, observation, response, thought,
state, execution_time, query, extra_info}`), `history` (the chat sent to the model), `info`
(`exit_status`, `submission`, `model_stats{instance_cost, tokens_sent, tokens_received, api_calls}`,
...), `environment` and `replay_config` (the run config, a JSON string in 1.x, an object in older
demonstrations; it holds `problem_statement{id, text}` and `agent.model.name`). A RetryAgent file also
has `attempts` (one such object per attempt); without a top-level `trajectory` each attempt is an episode.

Mapping:
- one step per `trajectory` entry; the tool is the first word of `action` (SWE-agent commands such as
  `open`, `edit`, `search_dir`, `str_replace_editor view`, `submit`; anything else is a shell command
  -> `bash`); params are `{"command": action}` plus the path for file commands.
- SWE-agent logs no per-step timestamps or exit codes: times are derived from the file's mtime and
  exit_code stays None.
- outcome: `success` is True iff `info.exit_status == "submitted"` (the agent submitted on its own);
  an auto-submission after a limit (`submitted (exit_cost)`, ...) is success False and truncated.
  `score` stays None: a submission is not a test verdict.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from typing import Any

import orjson

from producers.adapters.contract import Document, EpisodeDraft, Rejection, StepDraft
from producers.adapters.fields import describe, non_negative, text_of
from producers.adapters.tools import EDITOR_TOOLS, normalise_tool
from producers.errors import AdapterError

name = "swe-agent"

# SWE-agent's own commands (tools/ bundles: windowed, edit_*, search, submit, forfeit); any other
# action line is run by the shell.
_SWE_AGENT_COMMANDS = {
    "open", "goto", "scroll_up", "scroll_down", "create", "edit", "insert",
    "search_dir", "search_file", "find_file", "submit", "exit_forfeit", "exit",
}  # fmt: skip
# Commands whose first argument is the file they act on, and those acting on the open file.
_PATH_ARG_COMMANDS = {"open", "create"}
_OPEN_FILE_COMMANDS = {"goto", "scroll_up", "scroll_down", "edit", "insert"}
# exit_status fragments that mean the run was cut short by a limit rather than finished.
_LIMIT_STATUSES = ("exit_cost", "exit_context", "exit_total_execution_time", "exit_command_timeout")
_ERROR_STATUSES = ("exit_error", "exit_environment_error", "exit_format", "exit_api")


def detect(doc: Document) -> float:
    value = doc.value if doc.kind == "json" else None
    if not isinstance(value, dict):
        return 0.0
    if isinstance(value.get("trajectory"), list) and isinstance(value.get("info"), dict):
        return 0.95
    attempts = value.get("attempts")
    if isinstance(attempts, list) and attempts and all(_is_attempt(a) for a in attempts):
        return 0.9
    return 0.0


def _is_attempt(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("trajectory"), list)


def parse(doc: Document) -> Iterator[EpisodeDraft | Rejection]:
    value = doc.value
    if not isinstance(value, dict):
        raise AdapterError(f"{doc.path}: a SWE-agent .traj is a JSON object, got {describe(value)}")
    if "trajectory" in value or not isinstance(value.get("attempts"), list):
        yield _episode(doc, value, key="0", where="")
        return
    for index, attempt in enumerate(value.get("attempts") or []):
        try:
            yield _episode(doc, attempt, key=f"attempt-{index}", where=f"attempts[{index}].")
        except AdapterError as exc:
            yield Rejection(f"{doc.path}: attempts[{index}]", str(exc), attempt)


def _episode(doc: Document, data: dict, key: str, where: str) -> EpisodeDraft:
    trajectory = data.get("trajectory")
    if not isinstance(trajectory, list):
        raise AdapterError(
            f"{doc.path}: {where}trajectory must be a list of steps, got {describe(trajectory)}"
        )
    info = data.get("info") if isinstance(data.get("info"), dict) else {}
    config = _replay_config(data.get("replay_config"))
    problem = config.get("problem_statement") if isinstance(config.get("problem_statement"), dict) else {}
    steps = [_step(doc, where, i, entry) for i, entry in enumerate(trajectory)]
    draft = EpisodeDraft(
        key=key,
        task_id=str(problem.get("id") or data.get("instance_id") or doc.stem),
        task=str(problem.get("text") or _first_user_message(data.get("history"))),
        domain="coding",
        agent="swe-agent",
        model=_model_name(config),
        steps=steps,
        metadata=_metadata(data, info),
    )
    _apply_outcome(draft, info)
    return draft


def _replay_config(raw: Any) -> dict:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str) and raw.strip():
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}
    return {}


def _model_name(config: dict) -> str:
    agent = config.get("agent") if isinstance(config.get("agent"), dict) else {}
    model = agent.get("model") if isinstance(agent.get("model"), dict) else {}
    return str(model.get("name") or model.get("model_name") or "")


def _first_user_message(history: Any) -> str:
    for item in history if isinstance(history, list) else []:
        if isinstance(item, dict) and item.get("role") == "user" and not item.get("is_demo"):
            return text_of(item.get("content"))
    return ""


def _step(doc: Document, where: str, index: int, entry: Any) -> StepDraft:
    if not isinstance(entry, dict):
        raise AdapterError(f"{doc.path}: {where}trajectory[{index}] must be an object, got {describe(entry)}")
    action = entry.get("action")
    if not isinstance(action, str):
        raise AdapterError(
            f"{doc.path}: {where}trajectory[{index}].action must be a string, got {describe(action)}"
        )
    tool, params = command_tool(action, _open_file(entry.get("state")))
    return StepDraft(
        tool=tool,
        params=params,
        thought=str(entry.get("thought") or ""),
        observation=text_of(entry.get("observation")),
    )


def _open_file(state: Any) -> str:
    """`state.open_file` (state is an object, or a JSON string in older files); "" when none."""
    if isinstance(state, str):
        try:
            state = orjson.loads(state)
        except orjson.JSONDecodeError:
            return ""
    value = state.get("open_file") if isinstance(state, dict) else None
    return value if isinstance(value, str) and value not in ("", "n/a") else ""


def command_tool(action: str, open_file: str = "") -> tuple[str, dict[str, Any]]:
    """The tool and params of a SWE-agent action line (`open_file`: the file the editor has open).

    >>> command_tool("open src/marshmallow/fields.py 1474")
    ('read_file', {'command': 'open src/marshmallow/fields.py 1474', 'path': 'src/marshmallow/fields.py'})
    >>> command_tool("edit 10:12", open_file="/r/a.py")[1]["path"]
    '/r/a.py'
    >>> command_tool("python reproduce.py")
    ('bash', {'command': 'python reproduce.py'})
    """
    stripped = action.strip()
    params: dict[str, Any] = {"command": action}
    first_line = stripped.splitlines()[0] if stripped else ""
    words = first_line.split()
    head = words[0] if words else ""
    if head in EDITOR_TOOLS:
        args = _split(first_line)
        sub = args[1] if len(args) > 1 else ""
        if len(args) > 2:
            params["path"] = args[2]
        return normalise_tool(head, {"command": sub}), params
    if head not in _SWE_AGENT_COMMANDS:
        return "bash", params
    mapped = normalise_tool(head)
    args = _split(first_line)
    if head in _PATH_ARG_COMMANDS and len(args) > 1:
        params["path"] = args[1]
    elif head in _OPEN_FILE_COMMANDS and open_file:
        params["path"] = open_file
    return mapped, params


def _split(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError:
        return line.split()


def _metadata(data: dict, info: dict) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "exit_status": info.get("exit_status"),
        "submission": info.get("submission"),
        "environment": data.get("environment"),
    }
    if isinstance(info.get("model_stats"), dict):
        meta["model_stats"] = info["model_stats"]
    for extra in ("swe_agent_version", "swe_agent_hash", "best_attempt_idx"):
        if extra in info:
            meta[extra] = info[extra]
    return {k: v for k, v in meta.items() if v is not None}


def _apply_outcome(draft: EpisodeDraft, info: dict) -> None:
    status = info.get("exit_status")
    stats = info.get("model_stats") if isinstance(info.get("model_stats"), dict) else {}
    draft.input_tokens = non_negative(stats.get("tokens_sent"))
    draft.output_tokens = non_negative(stats.get("tokens_received"))
    cost = stats.get("instance_cost")
    draft.cost_usd = float(cost) if isinstance(cost, int | float) and cost >= 0 else None
    if not isinstance(status, str) or not status:
        draft.outcome_source = "unknown"
        draft.terminated = False
        return
    draft.outcome_source = "info.exit_status"
    draft.success = status == "submitted"
    draft.truncated = any(fragment in status for fragment in _LIMIT_STATUSES)
    draft.terminated = not draft.truncated
    if any(fragment in status for fragment in _ERROR_STATUSES):
        draft.error = f"exit_status={status}"

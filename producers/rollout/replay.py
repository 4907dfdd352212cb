"""`agentstream replay-trajectory`: re-run a recorded trajectory's tool calls in a fresh sandbox and
find the first step whose output differs from what was recorded.

A trajectory is a list of steps `{tool, params, observation}`: a JSON file holding such a list (or
an object with `steps`), a file any ingest adapter reads (SWE-agent `.traj`, OpenHands, ...: its
first episode's `step.recorded` events), or the rows the caller fetched by trajectory id. Each step
becomes one sandbox call (`replay_call`); outputs are compared with whitespace normalised. The
replay stops at the first divergence: later steps would only diverge because of it.

This module must not know where trajectories are stored (ClickHouse is the CLI's business).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from producers.errors import ProducerError
from producers.sandbox.base import TOOLS, Sandbox, ToolResult

# Adapter vocabulary (producers/adapters/tools.py) -> the sandbox tool that can replay it.
_SHELL_TOOLS = {"bash", "shell", "ipython"}


class ReplayError(ProducerError):
    """A trajectory that cannot be read or has no steps."""


@dataclass(frozen=True)
class ReplayReport:
    """What a replay found; `divergence_step` is None when every step reproduced."""

    success: bool
    divergence_step: int | None
    completed_steps: int
    total_steps: int
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def normalise(text: str) -> str:
    """Whitespace-insensitive form of an output.

    >>> normalise("  a\\n\\tb  ")
    'a b'
    """
    return " ".join(str(text).split())


def replay_call(step: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The sandbox call that re-runs `step`, or None when no sandbox tool can.

    >>> replay_call({"tool": "bash", "params": {"command": "ls -a"}})
    ('shell', {'command': 'ls -a'})
    >>> replay_call({"tool": "calculator", "params": {"expression": "1+1"}}) is None
    True
    """
    tool, params = str(step.get("tool") or ""), dict(step.get("params") or {})
    if tool in TOOLS:
        return tool, params
    command = params.get("command")
    if tool in _SHELL_TOOLS and isinstance(command, str | list):
        return "shell", {"command": command}
    if tool == "read_file" and "path" in params and "command" not in params:
        return "file_read", {"path": params["path"]}
    if tool == "write_file" and {"path", "content"} <= set(params):
        return "file_write", {"path": params["path"], "content": params["content"]}
    if isinstance(command, str):  # an agent command (SWE-agent `open`, `edit`, ...) run as a shell line
        return "shell", {"command": command}
    return None


def observed(result: ToolResult) -> str:
    """What the agent would have seen: the output, or the error when there is no output."""
    return result.output if result.output.strip() else (result.error or "")


def replay(steps: list[dict[str, Any]], sandbox: Sandbox) -> ReplayReport:
    """Re-run `steps` in `sandbox` (fresh) until the first output that differs from the recording."""
    total = len(steps)
    for index, step in enumerate(steps):
        call = replay_call(step)
        recorded = str(step.get("observation") or "")
        if call is None:
            reason = f"tool {step.get('tool')!r} has no sandbox equivalent"
            return ReplayReport(False, index, index, total, {"tool": step.get("tool"), "reason": reason})
        result = sandbox.run(*call)
        if normalise(observed(result)) != normalise(recorded):
            details = {
                "tool": step.get("tool"), "sandbox_tool": call[0], "params": call[1],
                "recorded": recorded[:2000], "replayed": observed(result)[:2000],
                "exit_code": result.exit_code, "reason": "output differs from the recorded observation",
            }  # fmt: skip
            return ReplayReport(False, index, index, total, details)
    return ReplayReport(True, None, total, total, {})


def load_steps(path: Path) -> list[dict[str, Any]]:
    """The steps of a trajectory file: a plain steps list / `{"steps": [...]}`, or else the first
    episode any ingest adapter finds in it."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ReplayError(f"trajectory file {path}: cannot be read ({exc})") from None
    try:
        value = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        value = None
    plain = value.get("steps") if isinstance(value, dict) else value
    if isinstance(plain, list) and plain and all(isinstance(s, dict) and "tool" in s for s in plain):
        return [dict(s) for s in plain]
    return _adapter_steps(path, data)


def _adapter_steps(path: Path, data: bytes) -> list[dict[str, Any]]:
    from producers.adapters.ingest import convert_file

    report = convert_file(path, data, datetime.fromtimestamp(path.stat().st_mtime, UTC))
    if report.rejections and not report.events:
        raise ReplayError(f"trajectory file {path}: {report.rejections[0].reason}")
    steps = [e for e in report.events if e.type == "step.recorded"]
    if not steps:
        raise ReplayError(f"trajectory file {path}: no steps found")
    first = steps[0].trajectory_id
    return [
        {"tool": e.tool, "params": dict(e.params), "observation": e.observation}
        for e in sorted((e for e in steps if e.trajectory_id == first), key=lambda e: e.step_index)
    ]

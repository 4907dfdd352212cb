"""The `Sandbox` interface: the agent tools (file_read, file_write, shell, search, git, submit),
their dispatch by name, and the `ToolResult` every tool returns.

It owns the tool names, parameter checking and the "errors as data" rule: a refused request
(`SandboxError`) becomes a `ToolResult` with exit_code 1, never an exception to the agent loop.
It must not know how commands run (processes, containers): that is each backend's own module.
"""

from __future__ import annotations

import abc
import inspect
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producers.sandbox.errors import SandboxError

__all__ = ["TOOLS", "Sandbox", "ToolResult", "truncate"]

log = logging.getLogger(__name__)

TOOLS = ("file_read", "file_write", "shell", "search", "git", "submit")
TRUNCATED_MARKER = "\n...[output truncated at {limit} bytes]"


@dataclass
class ToolResult:
    """What one tool call returned: its output, exit code, error text and wall time."""

    output: str
    exit_code: int
    error: str | None = None
    timed_out: bool = False
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def truncate(data: bytes, limit: int) -> str:
    """Decode command output, cut to `limit` bytes with a visible marker.

    >>> truncate(b"abcdef", 3)
    'abc\\n...[output truncated at 3 bytes]'
    """
    if len(data) <= limit:
        return data.decode("utf-8", errors="replace")
    return data[:limit].decode("utf-8", errors="replace") + TRUNCATED_MARKER.format(limit=limit)


class Sandbox(abc.ABC):
    """A private workspace and the tools an agent uses in it; a context manager.

    Subclasses implement the five real tools plus `reset`, `snapshot` and `close`; `run` does the
    dispatch, parameter binding and error-to-result conversion once for all of them.
    """

    workspace: Path
    submitted: bool = False
    answer: str | None = None

    def run(self, tool: str, params: dict[str, Any] | None = None) -> ToolResult:
        """Run one tool by name; an unknown tool, bad params or a refused path give exit_code 1."""
        start = time.monotonic()
        if tool not in TOOLS:
            return ToolResult(
                "", 1, f"unknown tool {tool!r}; known tools: {', '.join(TOOLS)}", duration_ms=_ms(start)
            )
        method = getattr(self, tool)
        try:
            bound = inspect.signature(method).bind(**(params or {}))
        except TypeError as exc:
            return ToolResult("", 1, f"bad parameters for tool {tool!r}: {exc}", duration_ms=_ms(start))
        try:
            result = method(*bound.args, **bound.kwargs)
        except SandboxError as exc:
            return ToolResult("", 1, str(exc), duration_ms=_ms(start))
        if not result.duration_ms:
            result.duration_ms = _ms(start)
        return result

    def submit(self, answer: str = "") -> ToolResult:
        """The terminal tool: records the answer and marks the sandbox `submitted`."""
        self.submitted, self.answer = True, answer
        return ToolResult(answer, 0)

    @abc.abstractmethod
    def file_read(self, path: str, start_line: int | None = None, end_line: int | None = None) -> ToolResult:
        """A file's text, or lines start_line..end_line (1-based, inclusive)."""

    @abc.abstractmethod
    def file_write(self, path: str, content: str, create_dirs: bool = True) -> ToolResult:
        """Write `content` to a file in the workspace (parents created when `create_dirs`)."""

    @abc.abstractmethod
    def shell(
        self, command: list[str] | str, timeout_s: float | None = None, work_dir: str | None = None
    ) -> ToolResult:
        """Run an argv (a list) or a shell script (a str, as `/bin/sh -c <str>`) in the workspace."""

    @abc.abstractmethod
    def search(self, pattern: str, path: str = ".", file_pattern: str | None = None) -> ToolResult:
        """Lines matching the regular expression `pattern`, as `relpath:lineno:line`."""

    @abc.abstractmethod
    def git(self, subcommand: str, args: list[str] | None = None) -> ToolResult:
        """Run `git <subcommand> <args...>` in the workspace."""

    @abc.abstractmethod
    def reset(self, snapshot_dir: Path | None = None) -> None:
        """A fresh workspace, empty or a copy of `snapshot_dir`."""

    @abc.abstractmethod
    def snapshot(self, target: Path) -> Path:
        """Copy the workspace to `target` and return it."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop everything the sandbox started and remove its workspace."""

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shell_argv(command: list[str] | str) -> list[str]:
    """The argv of a shell command: a str is one `sh -c` script argument, never spliced into a string.

    >>> shell_argv("echo $HOME")
    ['/bin/sh', '-c', 'echo $HOME']
    """
    if isinstance(command, str):
        return ["/bin/sh", "-c", command]
    if not command or not all(isinstance(part, str) for part in command):
        raise SandboxError(f"shell command must be a non-empty list of str or a str, got {command!r}")
    return list(command)


def git_argv(subcommand: str, args: list[str] | None) -> list[str]:
    """`["git", subcommand, *args]`; a subcommand that is an option (`-c ...`) is refused."""
    if not isinstance(subcommand, str) or not subcommand or subcommand.startswith("-"):
        raise SandboxError(f"git subcommand must be a command name, got {subcommand!r}")
    if args is not None and not all(isinstance(a, str) for a in args):
        raise SandboxError(f"git args must be a list of str, got {args!r}")
    return ["git", subcommand, *(args or [])]


def _ms(start: float) -> float:
    return (time.monotonic() - start) * 1000.0

"""`SandboxEnv`: a coding task in a sandbox workspace, registered as "sandbox" (domain "coding").

A task is a dict (a line of `producers/envs/tasks/sandbox.jsonl`, or a SWE-style instance from
`producers.envs.swe.load_swe_instances`):

    {"task_id": "off-by-one",
     "instruction": "Fix last_n in util.py",          # or "problem_statement"
     "files": {"util.py": "...", "test_util.py": "..."},
     "test_files": {"test_util.py": "..."},           # optional: rewritten before every verify()
     "test_command": ["python3", "test_util.py"],     # argv list, or a str run by /bin/sh -c
     "setup_commands": [["python3", "-m", "compileall", "."]],   # optional
     "snapshot_dir": "/path/to/repo", "base_commit": "abc123"}   # optional (SWE-style)

`reset()` builds a fresh workspace (a copy of `snapshot_dir` checked out at `base_commit`, then
`files`), commits it as a base git commit when git works (so the agent's `git diff` means
something) and answers the instruction plus the file list. `step()` runs one sandbox tool
(`file_read`, `file_write`, `shell`, `search`, `git`, `submit`); `submit` ends the episode.
`verify()` runs the task's test command in the sandbox: True iff it exits 0, whatever the agent
claimed; after the episode ends the verdict is cached.

It owns the task-to-workspace mapping and the verdict; how commands run is `producers.sandbox`.
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any

from producers.envs.errors import EnvError
from producers.envs.protocol import Action, AgentEnv, TimeStep, checked_action, finish_step
from producers.sandbox.base import TOOLS, Sandbox, ToolResult

log = logging.getLogger(__name__)

GIT_IDENTITY = (("user.email", "sandbox@agentstream.invalid"), ("user.name", "agentstream sandbox"))
TEST_TIMEOUT_S = 120.0
TEST_PATCH_PATH = ".agentstream-test.patch"


class SandboxEnv(AgentEnv):
    """A coding task in a `producers.sandbox` workspace (see the module docstring)."""

    domain = "coding"
    terminal_tools = frozenset({"submit"})

    def __init__(self, backend: str = "auto", limits: Any = None, max_steps: int = 30):
        """`backend`: "auto", "local" or "docker"; `limits`: a `producers.sandbox.local.Limits` for
        the local backend (None: its defaults); `max_steps`: the episode is truncated after it."""
        if backend not in ("auto", "local", "docker"):
            raise EnvError(f"backend: expected 'auto', 'local' or 'docker', got {backend!r}")
        if not isinstance(max_steps, int) or max_steps < 1:
            raise EnvError(f"max_steps: expected a positive integer, got {max_steps!r}")
        self.backend, self.limits, self.max_steps = backend, limits, max_steps
        self.sandbox: Sandbox | None = None
        self.task: dict[str, Any] | None = None
        self.steps = 0
        self._done = False
        self._verdict: bool | None = None

    @property
    def available_tools(self) -> list[str]:
        return list(TOOLS)

    def reset(self, *, task: Any = None, seed: int | None = None) -> TimeStep:
        """A fresh workspace for `task` (None: a built-in task drawn from `seed`)."""
        if task is None:
            task = _builtin_task(seed)
        self.task = parse_sandbox_task(task)
        self.steps, self._done, self._verdict = 0, False, None
        sandbox = self._sandbox()
        snapshot = self.task.get("snapshot_dir")
        sandbox.reset(Path(snapshot) if snapshot else None)
        if snapshot and self.task.get("base_commit"):
            _run_or_raise(
                sandbox, "git", {"subcommand": "checkout", "args": ["-q", "-f", self.task["base_commit"]]}
            )
        for path, content in {**self.task["files"], **self.task["test_files"]}.items():
            _run_or_raise(sandbox, "file_write", {"path": path, "content": content})
        for command in self.task["setup_commands"]:
            _run_or_raise(sandbox, "shell", {"command": command})
        has_git = _commit_base(sandbox)
        files = _list_files(sandbox, has_git, self.task)
        text = self.task["instruction"] + "\n\nFiles in the workspace:\n" + "\n".join(files)
        text += "\n\nTools: " + ", ".join(TOOLS) + ". Call submit when you are done."
        info = {"task_id": self.task.get("task_id"), "files": files, "git": has_git}
        info |= {"max_steps": self.max_steps, "available_tools": self.available_tools}
        return TimeStep(observation=text, info=info)

    def step(self, action: Action) -> TimeStep:
        """Run one sandbox tool; `submit` ends the episode and runs the tests once."""
        started = self.task is not None and self.sandbox is not None
        tool, params = checked_action(action, started, self._done)
        self.steps += 1
        if not isinstance(params, dict):
            result = ToolResult("", 1, f"params: expected an object, got {params!r}")
        else:
            result = self._run_tool(tool, params)
        ts = _timestep(result, tool)
        if tool == "submit":
            ts.terminated = True
            self._verdict = self._run_tests()
            ts.reward = 1.0 if self._verdict else 0.0
            ts.info["tests_passed"] = self._verdict
        finish_step(ts, self.steps, self.max_steps, "step")
        self._done = ts.done
        return ts

    def _run_tool(self, tool: Any, params: dict[str, Any]) -> ToolResult:
        assert self.sandbox is not None
        if self.step_deadline is not None:
            left = self.step_deadline - time.monotonic()
            if left <= 0:
                return ToolResult("", 1, f"{tool}: the step deadline passed", timed_out=True)
            if tool == "shell":
                given = params.get("timeout_s")
                params = {**params, "timeout_s": min(given, left) if isinstance(given, int | float) else left}
        if not isinstance(tool, str):
            return ToolResult(
                "", 1, f"tool: expected a tool name, got {tool!r}; available tools: {list(TOOLS)}"
            )
        return self.sandbox.run(tool, params)

    def verify(self) -> bool | None:
        """True iff the task's tests pass in the workspace now (cached once the episode ended);
        None before reset() or for a task without a test command."""
        if self._verdict is not None:
            return self._verdict
        if self.task is None or self.sandbox is None or self.task["test_command"] is None:
            return None
        verdict = self._run_tests()
        if self._done:
            self._verdict = verdict
        return verdict

    def _run_tests(self) -> bool | None:
        """Restore the task's own test files (the agent may have edited them), apply its test
        patch, run the test command: True iff it exits 0."""
        assert self.task is not None and self.sandbox is not None
        if self.task["test_command"] is None:
            return None
        for path, content in self.task["test_files"].items():
            if not self.sandbox.run("file_write", {"path": path, "content": content}).ok:
                return False
        if self.task.get("test_patch") and not self._apply_test_patch():
            return False
        result = self.sandbox.run(
            "shell", {"command": self.task["test_command"], "timeout_s": TEST_TIMEOUT_S}
        )
        if not result.ok:
            log.info("sandbox task %s: tests failed: %s", self.task.get("task_id"), result.output[-500:])
        return result.ok

    def _apply_test_patch(self) -> bool:
        assert self.task is not None and self.sandbox is not None
        wrote = self.sandbox.run("file_write", {"path": TEST_PATCH_PATH, "content": self.task["test_patch"]})
        applied = self.sandbox.run("git", {"subcommand": "apply", "args": [TEST_PATCH_PATH]})
        return wrote.ok and applied.ok

    def _sandbox(self) -> Sandbox:
        """The sandbox, created on the first reset: local when asked for or when "auto" finds no
        Docker engine (`limits` applies to the local backend only)."""
        if self.sandbox is None:
            from producers.sandbox.docker import docker_unavailable_reason, make_sandbox

            if self.backend == "local" or (
                self.backend == "auto" and docker_unavailable_reason() is not None
            ):
                from producers.sandbox.local import Limits, LocalSandbox

                self.sandbox = LocalSandbox(limits=self.limits or Limits())
            else:
                self.sandbox = make_sandbox("docker")
        return self.sandbox

    def close(self) -> None:
        """Close the sandbox (its workspace is removed)."""
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None


def parse_sandbox_task(task: Any) -> dict[str, Any]:
    """A task dict with every field checked and defaulted; a bad field raises `EnvError` naming it.

    >>> t = parse_sandbox_task({"files": {"a.py": "x = 1"}, "test_command": "true"})
    >>> t["instruction"], t["test_command"], t["setup_commands"]
    ('', 'true', [])
    """
    if not isinstance(task, dict):
        raise EnvError(f"sandbox task: expected an object, got {type(task).__name__}")
    where = f"sandbox task {task.get('task_id', task.get('instance_id'))!r}"
    out = dict(task)
    for name in ("files", "test_files"):
        out[name] = _str_map(task.get(name) or {}, f"{where}: field {name!r}")
    if not out["files"] and not out["test_files"] and not task.get("snapshot_dir"):
        raise EnvError(f"{where}: needs 'files' (path -> content) or 'snapshot_dir'")
    if task.get("snapshot_dir") is not None and not Path(task["snapshot_dir"]).is_dir():
        raise EnvError(f"{where}: field 'snapshot_dir': {task['snapshot_dir']!r} is not a directory")
    out["test_command"] = _command(task.get("test_command"), f"{where}: field 'test_command'", optional=True)
    setup = task.get("setup_commands") or []
    if not isinstance(setup, list):
        raise EnvError(f"{where}: field 'setup_commands': expected a list, got {setup!r}")
    out["setup_commands"] = [_command(c, f"{where}: field 'setup_commands'") for c in setup]
    instruction = task.get("problem_statement") or task.get("instruction") or ""
    if not isinstance(instruction, str):
        raise EnvError(f"{where}: field 'instruction': expected a string, got {instruction!r}")
    out["instruction"] = instruction
    return out


def _str_map(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise EnvError(f"{where}: expected an object of path -> text, got {value!r:.200}")
    return dict(value)


def _command(value: Any, where: str, optional: bool = False) -> list[str] | str | None:
    if value is None and optional:
        return None
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and value and all(isinstance(p, str) for p in value):
        return list(value)
    raise EnvError(f"{where}: expected an argv list of strings or a shell string, got {value!r}")


def _run_or_raise(sandbox: Sandbox, tool: str, params: dict[str, Any]) -> ToolResult:
    """Run a setup tool call; a failure raises `EnvError` with the call and its output."""
    result = sandbox.run(tool, params)
    if not result.ok:
        call = (
            " ".join([tool, params.get("subcommand", ""), *params.get("args", [])]) if tool == "git" else tool
        )
        target = params.get("command", params.get("path", ""))
        detail = result.output.strip()[-500:] or result.error
        raise EnvError(f"sandbox task setup: {call} {target!r} failed (exit {result.exit_code}): {detail}")
    return result


def _commit_base(sandbox: Sandbox) -> bool:
    """Commit the workspace as the base (a repo is created when there is none); False when git
    does not work here, in which case the `git` tool simply answers errors."""
    prefix = sandbox.run("git", {"subcommand": "rev-parse", "args": ["--show-prefix"]})
    in_own_repo = prefix.ok and not prefix.output.strip()  # not inside some enclosing repo
    if not in_own_repo and not sandbox.run("git", {"subcommand": "init", "args": ["-q"]}).ok:
        log.info("sandbox: git is unavailable; the workspace is not a repository")
        return False
    for key, value in GIT_IDENTITY:
        sandbox.run("git", {"subcommand": "config", "args": [key, value]})
    sandbox.run("git", {"subcommand": "add", "args": ["-A"]})
    status = sandbox.run("git", {"subcommand": "status", "args": ["--porcelain"]})
    if status.ok and status.output.strip():
        commit = sandbox.run(
            "git", {"subcommand": "commit", "args": ["-q", "--no-verify", "-m", "agentstream base"]}
        )
        if not commit.ok:
            log.info("sandbox: base commit failed: %s", commit.error or commit.output[-300:])
    return True


def _list_files(sandbox: Sandbox, has_git: bool, task: dict[str, Any]) -> list[str]:
    if has_git:
        listed = sandbox.run("git", {"subcommand": "ls-files", "args": []})
        if listed.ok:
            return [line for line in listed.output.splitlines() if line and line != TEST_PATCH_PATH]
    return sorted({*task["files"], *task["test_files"]})


def _timestep(result: ToolResult, tool: Any) -> TimeStep:
    observation = result.output
    if result.error:
        observation = f"error: {result.error}" + (f"\n{result.output}" if result.output else "")
    info = {"exit_code": result.exit_code, "error": result.error, "tool": tool, "timed_out": result.timed_out}
    return TimeStep(observation=observation, info=info)


def _builtin_task(seed: int | None) -> dict[str, Any]:
    from producers.envs.tasks import builtin_tasks

    tasks = builtin_tasks("sandbox")
    chosen = random.Random(seed).choice(tasks)
    return chosen.reset_task

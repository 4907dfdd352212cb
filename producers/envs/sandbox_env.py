"""`SandboxEnv`: a coding task in a sandbox workspace, registered as "sandbox" (domain "coding").

A task is a dict (a line of `producers/envs/tasks/sandbox.jsonl`, or a SWE-style instance from
`producers.envs.swe.load_swe_instances`):

    {"task_id": "off-by-one",
     "instruction": "Fix last_n in util.py",          # or "problem_statement"
     "files": {"util.py": "...", "test_util.py": "..."},
     "test_files": {"test_util.py": "..."},           # optional: the agent's edits never count
     "test_command": ["python3", "test_util.py"],     # argv list, or a str run by /bin/sh -c
     "setup_commands": [["python3", "-m", "compileall", "."]],   # optional
     "snapshot_dir": "/path/to/repo", "base_commit": "abc123",   # optional (SWE-style)
     "FAIL_TO_PASS": ["t.py::test_a"], "PASS_TO_PASS": ["t.py::test_b"], "test_patch": "diff ...",
     "reference_patch": "diff ..."}                   # optional: the gold fix, never shown

The built-in tasks keep the whole repository inline in `files` and its tests in `test_files`, so a
task travels as one JSON object (docs/operations.md, "The built-in coding tasks", says how to add one).

Without a `test_command`, FAIL_TO_PASS is run with pytest; with one, the command is the
FAIL_TO_PASS check. PASS_TO_PASS ids are run with pytest and must still pass. `reference_patch` is
checked and dropped by `parse_sandbox_task` (the env never holds it, so no observation, info or
record can show it); it serves only to check the task itself
(tests/integration/envs/test_coding_tasks.py).

`reset()` builds a fresh workspace (a copy of `snapshot_dir` checked out at `base_commit`, then
`files`), commits it as a base git commit when git works (so the agent's `git diff` means
something) and answers the instruction plus the file list. `step()` runs one sandbox tool
(`file_read`, `file_write`, `shell`, `search`, `git`, `submit`); `submit` ends the episode.
`verify()` never trusts the agent's workspace: it takes the agent's changes as a git diff against
the base commit, applies them to a second, fresh workspace built from the task in a second sandbox
of the same backend, drops the changes that do not count (the task's tests, conftest.py and other
test configuration, sitecustomize, bytecode, modules that shadow others: see
`producers.envs.sandbox_verdict`), and runs the checks there. True iff they all pass, whatever the
agent claimed; after the episode ends the verdict is cached.

It owns the task-to-workspace mapping; how the verdict is reached is `sandbox_verdict`, how
commands run is `producers.sandbox`.
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any

import orjson

from producers.envs.errors import EnvError
from producers.envs.protocol import (
    HIDDEN_TASK_FIELDS,
    Action,
    AgentEnv,
    TimeStep,
    checked_action,
    finish_step,
    shown_task,
)
from producers.envs.sandbox_verdict import (
    VerdictRefused,
    agent_patch,
    checks_of,
    decide,
    prepare_workspace,
    pytest_command,
)
from producers.sandbox.base import TOOLS, Sandbox, ToolResult

log = logging.getLogger(__name__)


class SandboxEnv(AgentEnv):
    """A coding task in a `producers.sandbox` workspace (see the module docstring)."""

    domain = "coding"
    terminal_tools = frozenset({"submit"})
    operator_kwargs = frozenset({"backend", "limits", "unisolated", "docker_host", "image"})

    def __init__(
        self,
        backend: str = "auto",
        limits: Any = None,
        max_steps: int = 30,
        unisolated: bool = False,
        docker_host: str | None = None,
        image: str | None = None,
    ):
        """`backend`: "auto", "local" or "docker" (`producers.sandbox.choice` says in which order
        "auto" tries them); `limits`: a `producers.sandbox.local.Limits` for the local backend (None:
        its defaults); `max_steps`: the episode is truncated after it; `unisolated`: let the local
        backend run agent commands on the host when bubblewrap cannot be had (never the default);
        `docker_host`, `image`: the Docker backend's engine and image (None: DOCKER_HOST, the
        sandbox image)."""
        if backend not in ("auto", "local", "docker"):
            raise EnvError(f"backend: expected 'auto', 'local' or 'docker', got {backend!r}")
        if not isinstance(max_steps, int) or max_steps < 1:
            raise EnvError(f"max_steps: expected a positive integer, got {max_steps!r}")
        if not isinstance(unisolated, bool):
            raise EnvError(f"unisolated: expected true or false, got {unisolated!r}")
        for name, value in (("docker_host", docker_host), ("image", image)):
            if value is not None and (not isinstance(value, str) or not value):
                raise EnvError(f"{name}: expected a non-empty string, got {value!r}")
        if isinstance(limits, dict):  # from JSON (--env-args): the fields of `Limits`, checked there
            limits = _limits_from(limits)
        if backend == "docker" and limits is not None:
            raise EnvError("limits: the local backend's Limits do not apply to backend 'docker'")
        if backend == "local" and (docker_host is not None or image is not None):
            raise EnvError(
                f"docker_host, image: do not apply to backend 'local', got {docker_host!r}, {image!r}"
            )
        self.backend, self.limits, self.max_steps = backend, limits, max_steps
        self.unisolated, self.docker_host, self.image = unisolated, docker_host, image
        self.sandbox: Sandbox | None = None
        self.task: dict[str, Any] | None = None
        self.steps = 0
        self._done = False
        self._verdict: bool | None = None
        self._base_commit: str | None = None

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
        self._base_commit = prepare_workspace(sandbox, self.task)
        has_git = self._base_commit is not None
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
        """True iff the task's checks pass on the agent's changes as they are now, applied to a fresh
        workspace (cached once the episode ended); None before reset() or for a task without checks."""
        if self._verdict is not None:
            return self._verdict
        if self.task is None or self.sandbox is None or not checks_of(self.task):
            return None
        verdict = self._run_tests()
        if self._done:
            self._verdict = verdict
        return verdict

    def _run_tests(self) -> bool | None:
        """The agent's diff applied to a fresh workspace in a second sandbox (closed afterwards),
        its checks run there: True iff all pass; a refusal (no git, a diff that does not apply)
        is False with its reason logged."""
        assert self.task is not None and self.sandbox is not None
        if not checks_of(self.task):
            return None
        try:
            if self._base_commit is None:
                raise VerdictRefused("git does not work in the sandbox, so there is no base to diff")
            patch = agent_patch(self.sandbox, self._base_commit)
            return decide(self._new_sandbox, self.task, patch)
        except VerdictRefused as exc:
            log.info("sandbox task %s: judged failed: %s", self.task.get("task_id"), exc)
            return False

    def _sandbox(self) -> Sandbox:
        """The agent's sandbox, created on the first reset."""
        if self.sandbox is None:
            self.sandbox = self._new_sandbox()
            # "auto" decided once: the verdict's fresh sandbox runs on the backend the agent had
            self.backend = self.sandbox.isolation.get("backend", self.backend)
        return self.sandbox

    def _new_sandbox(self) -> Sandbox:
        """A sandbox of this env's backend (`producers.sandbox.choice.make_sandbox`: isolated, or
        refused unless `unisolated`)."""
        from producers.sandbox.choice import make_sandbox

        docker = None
        if self.docker_host is not None or self.image is not None:
            from producers.sandbox.docker import DockerConfig
            from producers.sandbox.image import SANDBOX_IMAGE

            docker = DockerConfig(image=self.image or SANDBOX_IMAGE, docker_host=self.docker_host)
        return make_sandbox(self.backend, limits=self.limits, docker=docker, unisolated=self.unisolated)

    def close(self) -> None:
        """Close the sandbox (its workspace is removed)."""
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None


def _limits_from(fields: dict[str, Any]) -> Any:
    """A `Limits` from a JSON object of its fields; an unknown field or bad value is an `EnvError`."""
    from dataclasses import fields as dataclass_fields

    from producers.sandbox.errors import SandboxError
    from producers.sandbox.local import Limits

    known = {f.name for f in dataclass_fields(Limits)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise EnvError(f"limits: unknown field(s) {unknown}; known: {sorted(known)}")
    try:
        return Limits(**fields)
    except SandboxError as exc:
        raise EnvError(f"limits: {exc}") from None


def parse_sandbox_task(task: Any) -> dict[str, Any]:
    """A task dict with every field checked and defaulted, its hidden fields (`reference_patch`)
    left out; a bad field raises `EnvError` naming it.

    >>> t = parse_sandbox_task({"files": {"a.py": "x = 1"}, "test_command": "true", "reference_patch": "d"})
    >>> t["instruction"], t["test_command"], t["setup_commands"], "reference_patch" in t
    ('', 'true', [], False)
    """
    if not isinstance(task, dict):
        raise EnvError(f"sandbox task: expected an object, got {type(task).__name__}")
    where = f"sandbox task {task.get('task_id', task.get('instance_id'))!r}"
    for name in HIDDEN_TASK_FIELDS:
        if not isinstance(task.get(name, ""), str):
            raise EnvError(f"{where}: field {name!r}: expected a string, got {task[name]!r:.200}")
    out = shown_task(task)
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
    for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        out[name] = parse_test_ids(task.get(name), f"{where}: field {name!r}")
    if out["test_command"] is None and out["FAIL_TO_PASS"]:
        out["test_command"] = pytest_command(out["FAIL_TO_PASS"])
    instruction = task.get("problem_statement") or task.get("instruction") or ""
    if not isinstance(instruction, str):
        raise EnvError(f"{where}: field 'instruction': expected a string, got {instruction!r}")
    out["instruction"] = instruction
    return out


def parse_test_ids(value: Any, where: str) -> list[str]:
    """A list of test ids; SWE-bench's JSON-encoded string form is accepted.

    >>> parse_test_ids('["t.py::a"]', "x"), parse_test_ids(None, "x")
    (['t.py::a'], [])
    """
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            value = [value]
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, str) and t.strip() for t in value):
        raise EnvError(f"{where}: expected a list of test ids, got {value!r:.200}")
    return list(value)


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


def _list_files(sandbox: Sandbox, has_git: bool, task: dict[str, Any]) -> list[str]:
    if has_git:
        listed = sandbox.run("git", {"subcommand": "ls-files", "args": []})
        if listed.ok:
            return [line for line in listed.output.splitlines() if line]
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

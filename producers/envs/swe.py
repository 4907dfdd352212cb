"""SWE-bench-style instance files as `SandboxEnv` tasks, read offline (nothing is cloned).

A file is a JSON list or JSON Lines of instances:

    {"instance_id": "demo__calc-1", "repo": "demo/calc", "base_commit": "3f2a...",
     "problem_statement": "add() drops negative numbers ...",
     "snapshot_dir": "snapshots/demo__calc",         # a local copy of the repo (relative: to the file)
     "test_command": ["python3", "-m", "unittest"],  # or FAIL_TO_PASS, run with pytest
     "FAIL_TO_PASS": ["tests/test_add.py::test_negative"],  # must pass after the fix
     "PASS_TO_PASS": ["tests/test_add.py::test_positive"],  # must still pass (run with pytest)
     "test_patch": "diff --git ...",
     "patch": "diff --git ..."}                      # the gold fix: kept as `reference_patch`

    for task in load_swe_instances("instances.jsonl"):
        env = task.make_env(backend="local")
        env.reset(task=task.reset_task)   # the snapshot copied, base_commit checked out

`repo` is only a label (never a clone URL). FAIL_TO_PASS and PASS_TO_PASS may be lists or
SWE-bench's JSON-encoded strings; both are checked by `SandboxEnv.verify()` (see
`producers.envs.sandbox_verdict`), each listed id reported PASSED by pytest. A bad instance
raises `EnvError` naming the file, the line (JSON Lines) or the index (JSON list) and the field.
SWE-bench's `patch` (the gold fix) becomes the task's `reference_patch`, which `SandboxEnv` never
shows the agent and `RecorderWrapper` never records (`producers.envs.protocol.HIDDEN_TASK_FIELDS`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from producers.envs.errors import EnvError
from producers.envs.sandbox_env import parse_test_ids
from producers.envs.sandbox_verdict import pytest_command
from producers.envs.tasks import Task

REQUIRED = ("instance_id", "problem_statement", "snapshot_dir")
PASSED_THROUGH = ("repo", "base_commit", "test_patch", "setup_commands", "FAIL_TO_PASS", "PASS_TO_PASS")


def load_swe_instances(path: str | Path) -> list[Task]:
    """Every instance of a JSON list or JSON Lines file as a `Task(env="sandbox")`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EnvError(f"instance file {path}: cannot be read ({exc})") from None
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for where, row in _rows(path, text):
        task = swe_task(row, where, base_dir=path.parent)
        if task.task_id in seen:
            raise EnvError(f"{where}: instance_id {task.task_id!r} repeats {seen[task.task_id]}")
        seen[task.task_id] = where
        tasks.append(task)
    return tasks


def _rows(path: Path, text: str) -> list[tuple[str, Any]]:
    """(where, parsed row) pairs: `file[index]` for a JSON list, `file:line` for JSON Lines."""
    if text.lstrip().startswith("["):
        try:
            rows = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise EnvError(f"{path}: not a valid JSON list ({exc})") from None
        return [(f"{path}[{i}]", row) for i, row in enumerate(rows)]
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((f"{path}:{number}", orjson.loads(line)))
        except orjson.JSONDecodeError as exc:
            raise EnvError(f"{path}:{number}: not valid JSON ({exc})") from None
    return out


def swe_task(row: Any, where: str, base_dir: Path = Path(".")) -> Task:
    """One instance as a task; `where` starts every error message, a relative `snapshot_dir` is
    taken from `base_dir`."""
    if not isinstance(row, dict):
        raise EnvError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for name in REQUIRED:
        if not isinstance(row.get(name), str) or not row[name].strip():
            raise EnvError(f"{where}: field {name!r}: expected a non-empty string, got {row.get(name)!r}")
    snapshot = Path(row["snapshot_dir"])
    snapshot = snapshot if snapshot.is_absolute() else base_dir / snapshot
    if not snapshot.is_dir():
        raise EnvError(f"{where}: field 'snapshot_dir': {str(snapshot)!r} is not a directory")
    task: dict[str, Any] = {k: row[k] for k in PASSED_THROUGH if row.get(k) is not None}
    task |= {"problem_statement": row["problem_statement"], "snapshot_dir": str(snapshot.resolve())}
    if row.get("patch") is not None:
        task["reference_patch"] = row["patch"]
    for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        task[name] = parse_test_ids(row.get(name), f"{where}: field {name!r}")
    task["test_command"] = _test_command(row, where)
    for name, field in (("base_commit",) * 2, ("test_patch",) * 2, ("reference_patch", "patch")):
        if name in task and not isinstance(task[name], str):
            raise EnvError(f"{where}: field {field!r}: expected a string, got {task[name]!r:.200}")
    return Task(row["instance_id"], "sandbox", task, "coding")


def _test_command(row: dict[str, Any], where: str) -> list[str] | str:
    """The instance's `test_command`, else pytest on its FAIL_TO_PASS test ids."""
    command = row.get("test_command")
    if isinstance(command, str) and command.strip():
        return command
    if isinstance(command, list) and command and all(isinstance(p, str) for p in command):
        return command
    if command is not None:
        raise EnvError(
            f"{where}: field 'test_command': expected an argv list or a shell string, got {command!r}"
        )
    tests = parse_test_ids(row.get("FAIL_TO_PASS"), f"{where}: field 'FAIL_TO_PASS'")
    if not tests:
        raise EnvError(
            f"{where}: needs field 'test_command' or a non-empty 'FAIL_TO_PASS' list, got {tests!r}"
        )
    return pytest_command(tests)

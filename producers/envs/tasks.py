"""Task files: JSON Lines, one task per line, `{"task_id", "env", "task": {...}, "domain"?}`.

    for t in load_tasks("tests/data/tasks/calc.jsonl"):
        with t.make_env() as env:
            ts = env.reset(task=t.reset_task)

`env` is a registry id (`producers.envs.registry`); `task` is what that env's `reset(task=...)`
takes. A bad line raises `EnvError` naming the file, the line and the field. Blank lines are skipped.
The package ships example tasks under `producers/envs/tasks/` (`builtin_tasks("calc")`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from producers.envs.errors import EnvError
from producers.envs.protocol import AgentEnv
from producers.envs.registry import make
from schemas.json_input import json_object

BUILTIN_DIR = Path(__file__).resolve().parent / "tasks"


@dataclass(frozen=True)
class Task:
    """One line of a task file."""

    task_id: str
    env: str
    task: dict[str, Any] = field(default_factory=dict)
    domain: str | None = None

    @property
    def reset_task(self) -> dict[str, Any]:
        """The task for `reset(task=...)`, carrying `task_id` (so `RecorderWrapper` records it)."""
        return {**self.task, "task_id": self.task_id}

    def make_env(self, **overrides: Any) -> AgentEnv:
        """A new env of this task's registry id."""
        return make(self.env, **overrides)


def load_tasks(path: str | Path) -> list[Task]:
    """Every task of a JSON Lines file; a bad line or a repeated task_id raises `EnvError`."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise EnvError(f"task file {path}: cannot be read ({exc})") from None
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        task = parse_task_line(line, f"{path}:{number}")
        if task.task_id in seen:
            raise EnvError(f"{path}:{number}: task_id {task.task_id!r} repeats line {seen[task.task_id]}")
        seen[task.task_id] = number
        tasks.append(task)
    return tasks


def parse_task_line(line: str, where: str) -> Task:
    """One task from one JSON line; `where` (file:line) starts every error message."""
    row = json_object(line, where, EnvError)
    for name in ("task_id", "env"):
        if not isinstance(row.get(name), str) or not row[name].strip():
            raise EnvError(f"{where}: field {name!r}: expected a non-empty string, got {row.get(name)!r}")
    if not isinstance(row.get("task", {}), dict):
        raise EnvError(f"{where}: field 'task': expected an object, got {row['task']!r}")
    domain = row.get("domain")
    if domain is not None and not isinstance(domain, str):
        raise EnvError(f"{where}: field 'domain': expected a string, got {domain!r}")
    return Task(row["task_id"], row["env"], dict(row.get("task", {})), domain)


def builtin_tasks(name: str) -> list[Task]:
    """The example tasks shipped with the package (`producers/envs/tasks/<name>.jsonl`)."""
    path = BUILTIN_DIR / f"{name}.jsonl"
    if not path.is_file():
        known = sorted(p.stem for p in BUILTIN_DIR.glob("*.jsonl"))
        raise EnvError(f"no built-in task file {name!r}; available: {known}")
    return load_tasks(path)

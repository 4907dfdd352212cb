"""Task files: the shipped examples load and solve; bad lines name the file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from producers.envs import EnvError, builtin_tasks, load_tasks
from producers.envs.arithmetic import safe_eval

DATA = Path(__file__).resolve().parents[2] / "data" / "tasks"


def test_example_calc_tasks_load_and_each_is_solvable():
    tasks = load_tasks(DATA / "calc.jsonl")
    assert len(tasks) == 8 and len({t.task_id for t in tasks}) == 8
    for t in tasks:
        assert t.env == "calc" and t.domain == "math"
        with t.make_env() as env:
            env.reset(task=t.reset_task)
            answer = safe_eval(t.task["expression"])
            ts = env.step({"tool": "submit", "params": {"answer": answer}})
            assert ts.reward == 1.0 and env.verify() is True, t.task_id


def test_builtin_tasks_match_the_test_data():
    assert builtin_tasks("calc") == load_tasks(DATA / "calc.jsonl")
    with pytest.raises(
        EnvError, match=r"no built-in task file 'nope'; available: \['calc', 'conversation', 'sandbox'\]"
    ):
        builtin_tasks("nope")


def write(tmp_path, *lines: str) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = '{"task_id": "a", "env": "calc", "task": {"expression": "1+1"}}'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"tasks.jsonl:3: not valid JSON"),
        ("[1, 2]", r"tasks.jsonl:3: expected a JSON object, got list"),
        ('{"env": "calc"}', r"tasks.jsonl:3: field 'task_id': expected a non-empty string, got None"),
        ('{"task_id": "b", "env": ""}', r"tasks.jsonl:3: field 'env': expected a non-empty string, got ''"),
        ('{"task_id": "b", "env": "calc", "task": "1+1"}', r"jsonl:3: field 'task': expected an object"),
        ('{"task_id": "b", "env": "calc", "domain": 3}', r"tasks.jsonl:3: field 'domain': expected a string"),
        (GOOD, r"tasks.jsonl:3: task_id 'a' repeats line 1"),
    ],
)
def test_bad_lines_name_the_file_line_and_field(tmp_path, line, message):
    with pytest.raises(EnvError, match=message):
        load_tasks(write(tmp_path, GOOD, "", line))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(EnvError, match=r"task file .*missing.jsonl: cannot be read"):
        load_tasks(tmp_path / "missing.jsonl")


def test_task_defaults(tmp_path):
    (task,) = load_tasks(write(tmp_path, '{"task_id": "x", "env": "calc"}'))
    assert (task.task, task.domain, task.reset_task) == ({}, None, {"task_id": "x"})

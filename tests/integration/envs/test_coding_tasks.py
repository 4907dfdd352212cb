"""The built-in coding tasks (`producers/envs/tasks/sandbox.jsonl`) are worth learning: for every
task, on every sandbox backend, the verdict (`sandbox_verdict.decide`: a fresh sandbox, the patch
applied, the task's tests restored) judges its reference fix a pass and the empty patch a fail, and
in the unfixed repository each FAIL_TO_PASS test fails and each PASS_TO_PASS test passes, and no
other test exists (so no task passes without its fix, and none asks to keep a test that is broken
already).

Two verdicts per task and backend: the reference fix, and the empty patch, whose fresh workspace
(the task as shipped, once `decide` has run its checks) then runs the task's test files once to
report every test's outcome before it closes. The first test of a backend starts the checks of
every selected task of that backend at once, a few at a time; each test reports its own task.

Check one task: `pytest tests/integration/envs/test_coding_tasks.py -k <task_id>`.
"""

from __future__ import annotations

import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import PurePosixPath
from types import SimpleNamespace

import pytest

from producers.envs.protocol import HIDDEN_TASK_FIELDS
from producers.envs.sandbox_env import parse_sandbox_task
from producers.envs.sandbox_verdict import decide, pytest_command
from producers.envs.tasks import Task, builtin_tasks

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TASKS = builtin_tasks("sandbox")
WORKERS = {"local": 2, "docker": 4}  # tasks checked at once (CI has 2 cores)
OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)", re.MULTILINE)


def test_at_least_twenty_tasks_in_the_shipped_format():
    assert len(TASKS) >= 20
    assert len({t.task_id for t in TASKS}) == len(TASKS)
    for t in TASKS:
        task = t.task
        assert t.env == "sandbox" and t.domain == "coding", t.task_id
        assert "snapshot_dir" not in task and task["files"] and task["test_files"], t.task_id
        assert task["problem_statement"].strip(), t.task_id
        assert task["FAIL_TO_PASS"] and len(task["PASS_TO_PASS"]) >= 3, t.task_id
        assert not set(task["FAIL_TO_PASS"]) & set(task["PASS_TO_PASS"]), t.task_id
        listed = {i.split("::")[0] for i in (*task["FAIL_TO_PASS"], *task["PASS_TO_PASS"])}
        assert listed <= set(task["test_files"]), t.task_id
        assert all(PurePosixPath(p).parts[0] == "tests" for p in task["test_files"]), t.task_id
        fixed = _patched_paths(task["reference_patch"])
        assert fixed and fixed <= set(task["files"]), t.task_id  # the fix touches code, never tests


def test_the_env_never_holds_the_reference_patch():
    for t in TASKS:
        assert "reference_patch" in t.reset_task, t.task_id
        assert not HIDDEN_TASK_FIELDS & set(parse_sandbox_task(t.reset_task)), t.task_id


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.engine)])
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def new_sandbox(request, backend):
    """A factory of fresh sandboxes of the backend."""
    if backend == "local":
        from producers.sandbox.local import LocalSandbox

        return LocalSandbox
    engine = request.getfixturevalue("sandbox_engine")
    from producers.sandbox.docker import DockerConfig, DockerSandbox

    config = DockerConfig(image=engine.image, docker_host=engine.docker_host)
    return lambda: DockerSandbox(config)


@pytest.fixture(scope="module")
def checks(request, backend, new_sandbox) -> dict[str, Future]:
    """The check of every task this session runs on the backend, started together (a few at a time:
    a sandbox call mostly waits on a process or the engine), by task id."""
    wanted = [
        item.callspec.params["task"]
        for item in request.session.items
        if item.module is request.module
        and "task" in getattr(item, "callspec", SimpleNamespace(params={})).params
        and item.callspec.params.get("backend") == backend
    ]
    pool = ThreadPoolExecutor(WORKERS[backend], thread_name_prefix=f"coding-tasks-{backend}")
    futures = {task.task_id: pool.submit(check_task, new_sandbox, task) for task in wanted}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.timeout(900)  # the first test of a backend waits for the checks of all its tasks
@pytest.mark.parametrize("task", TASKS, ids=[t.task_id for t in TASKS])
def test_reference_fix_passes_and_the_unfixed_repository_fails(checks, task):
    check = checks[task.task_id].result()
    assert check.reference_fix is True, f"{task.task_id}: the reference fix is judged failed"
    assert check.empty_patch is False, f"{task.task_id}: the unfixed repository is judged passed"
    outcomes = check.outcomes
    listed = {*task.task["FAIL_TO_PASS"], *task.task["PASS_TO_PASS"]}
    assert set(outcomes) == listed, (
        f"{task.task_id}: tests run unfixed differ from the listed ones\n{check.output}"
    )
    still_passing = {i: outcomes.get(i) for i in task.task["FAIL_TO_PASS"] if outcomes.get(i) != "FAILED"}
    assert not still_passing, f"{task.task_id}: FAIL_TO_PASS tests that do not fail unfixed\n{check.output}"
    broken = {i: outcomes.get(i) for i in task.task["PASS_TO_PASS"] if outcomes.get(i) != "PASSED"}
    assert not broken, f"{task.task_id}: PASS_TO_PASS tests that do not pass unfixed\n{check.output}"


@dataclass(frozen=True)
class TaskCheck:
    reference_fix: bool  # decide()'s verdict on the reference patch
    empty_patch: bool  # decide()'s verdict on no change at all
    outcomes: dict[str, str]  # test id -> PASSED / FAILED / ... in the unfixed repository
    output: str  # the end of that pytest run's output


def check_task(new_sandbox, task: Task) -> TaskCheck:
    """Two verdicts: the reference fix, then the empty patch with every test's outcome unfixed."""
    parsed = parse_sandbox_task(task.reset_task)
    reference_fix = decide(new_sandbox, parsed, task.task["reference_patch"].encode())
    probe = OutcomeProbe(new_sandbox, sorted(parsed["test_files"]))
    empty_patch = decide(probe, parsed, b"")
    return TaskCheck(reference_fix, empty_patch, probe.outcomes, probe.output)


class OutcomeProbe:
    """A sandbox factory for `decide` that, when `decide` is done with the sandbox, runs the given
    tests (files or ids) there once and keeps each test id's reported outcome before closing it."""

    def __init__(self, new_sandbox, ids: list[str]):
        self.new_sandbox, self.ids = new_sandbox, ids
        self.outcomes: dict[str, str] = {}
        self.output = ""

    def __call__(self) -> OutcomeProbe:
        self.sandbox = self.new_sandbox()
        return self

    def __enter__(self):
        return self.sandbox

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                ran = self.sandbox.run("shell", {"command": pytest_command(self.ids), "timeout_s": 120})
                self.output = ran.output[-4000:]
                self.outcomes = {test_id: kind for kind, test_id in OUTCOME.findall(ran.output)}
        finally:
            self.sandbox.close()


def _patched_paths(patch: str) -> set[str]:
    return set(re.findall(r"^\+\+\+ b/(\S+)$", patch, re.MULTILINE))

"""SandboxEnv on the local backend: an agent that fixes the bug passes verify(), one that only
claims success does not; paths outside the workspace, unknown tools and truncation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from producers.envs import EnvError, MaxStepsWrapper, RecorderWrapper, SandboxEnv, builtin_tasks, make

TASK_ID = "pager-last-page-missing"  # page_count() rounds down, so the last partial page is lost
MODULE = "pager/paginate.py"
BUG, FIX = "max(1, total_items // per_page)", "max(1, -(-total_items // per_page))"


@pytest.fixture
def env():
    with SandboxEnv(backend="local") as sandbox_env:
        yield sandbox_env


@pytest.fixture
def task():
    return {t.task_id: t for t in builtin_tasks("sandbox")}[TASK_ID].reset_task


def fixed(env):
    """The module under test with the bug fixed (read from the workspace)."""
    return env.sandbox.run("file_read", {"path": MODULE}).output.replace(BUG, FIX)


def act(env, tool, **params):
    return env.step({"tool": tool, "params": params})


def test_reset_shows_instruction_files_and_a_base_commit(env, task):
    ts = env.reset(task=task)
    assert "page=3" in ts.observation and MODULE in ts.observation
    assert ts.info["files"] == sorted({*task["files"], *task["test_files"]})
    log = act(env, "git", subcommand="log", args=["--oneline"])
    assert log.info["exit_code"] == 0 and "agentstream base" in log.observation


def test_agent_that_fixes_the_bug_passes(env, task):
    env.reset(task=task)
    read = act(env, "file_read", path=MODULE)
    assert BUG in read.observation and read.info["exit_code"] == 0
    assert act(env, "file_write", path=MODULE, content=fixed(env)).info["exit_code"] == 0
    diff = act(env, "git", subcommand="diff", args=[])
    assert f"+    return {FIX}" in diff.observation
    ts = act(env, "submit", answer="fixed the slice")
    assert ts.terminated and ts.reward == 1.0 and ts.info["tests_passed"] is True
    assert env.verify() is True
    with pytest.raises(EnvError, match="after the episode ended"):
        act(env, "file_read", path=MODULE)


def test_the_reference_patch_is_neither_shown_nor_recorded(task):
    patch = task["reference_patch"]
    assert FIX in patch
    recorder = FakeRecorder()
    with RecorderWrapper(SandboxEnv(backend="local"), recorder) as env:
        ts = env.reset(task=task)
        assert FIX not in ts.observation and FIX not in repr(ts.info)
        assert "reference_patch" not in env.env.task
        found = act(env, "shell", command=["grep", "-rlF", "--", BUG, "."])
        assert found.info["exit_code"] == 0 and MODULE in found.observation
        found = act(env, "shell", command=["grep", "-rlF", "--", FIX, "."])
        assert found.info["exit_code"] == 1 and ".py" not in found.observation  # nowhere in the workspace
    [started] = recorder.started
    assert started["metadata"]["task"]["task_id"] == TASK_ID
    assert "reference_patch" not in started["metadata"]["task"] and FIX not in repr(started)


class FakeRecorder:
    """Keeps what `RecorderWrapper` asks to record (no broker)."""

    def __init__(self):
        self.started = []

    def episode(self, **fields):
        self.started.append(fields)
        return SimpleNamespace(trajectory_id="t-1", step=lambda **_: None, end=lambda **_: None)


def test_claiming_success_without_a_fix_fails(env, task):
    env.reset(task=task)
    ts = env.step({"tool": "submit", "params": {"answer": "all tests pass"}, "thought": "done, it works"})
    assert ts.terminated and ts.reward == 0.0
    assert env.verify() is False


def test_editing_the_tests_does_not_pass_verify(env, task):
    env.reset(task=task)
    trivial = "".join(f"def {i.split('::')[1]}():\n    pass\n\n\n" for i in task["FAIL_TO_PASS"])
    for path in task["test_files"]:
        act(env, "file_write", path=path, content=trivial)
    assert act(env, "shell", command=["python3", "-m", "pytest", "-q", "tests"]).info["exit_code"] == 0
    act(env, "submit")
    assert env.verify() is False  # the task's own test file is restored before the verdict


def test_path_outside_the_workspace_is_an_observation_error(env, task):
    env.reset(task=task)
    for path in ("../outside.txt", "/etc/passwd"):
        ts = act(env, "file_read", path=path)
        assert ts.observation.startswith("error:") and "outside the workspace" in ts.observation
        assert ts.info["exit_code"] == 1 and not ts.done


def test_unknown_tool_and_bad_params_do_not_end_the_episode(env, task):
    env.reset(task=task)
    ts = act(env, "rm_rf", path=".")
    assert ts.info["exit_code"] == 1 and "unknown tool 'rm_rf'" in ts.info["error"] and not ts.done
    ts = env.step({"tool": "file_read", "params": [MODULE]})
    assert ts.info["exit_code"] == 1 and "params" in ts.info["error"] and not ts.done


def test_shell_failure_reports_exit_code(env, task):
    env.reset(task=task)
    ts = act(env, "shell", command=["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
    assert ts.info["exit_code"] != 0 and "PageNotFound" in ts.observation and not ts.done


def test_truncated_at_max_steps_by_the_wrapper(task):
    wrapped = MaxStepsWrapper(make("sandbox", backend="local"), 2)
    with wrapped:
        wrapped.reset(task=task)
        assert not act(wrapped, "file_read", path=MODULE).done
        ts = act(wrapped, "search", pattern="def page_count")
        assert ts.truncated and not ts.terminated and f"{MODULE}:" in ts.observation
        assert wrapped.verify() is False


def test_own_max_steps_and_verdict_cached_after_the_end(task):
    with SandboxEnv(backend="local", max_steps=1) as env:
        env.reset(task=task)
        assert act(env, "file_write", path=MODULE, content=fixed(env)).truncated
        assert env.verify() is True
        env.sandbox.run("file_write", {"path": MODULE, "content": "broken("})
        assert env.verify() is True  # cached once the episode ended


@pytest.mark.parametrize(
    ("task", "message"),
    [
        ({"test_command": ["true"]}, "needs 'files'"),
        ({"files": {"a.py": 1}}, "field 'files'"),
        ({"files": {"a.py": ""}, "test_command": []}, "field 'test_command'"),
        ({"files": {"a.py": ""}, "setup_commands": "make"}, "field 'setup_commands'"),
        ("fix it", "expected an object"),
    ],
)
def test_bad_task_raises_env_error_naming_the_field(env, task, message):
    with pytest.raises(EnvError, match=message):
        env.reset(task=task)


def test_failing_setup_command_raises(env):
    with pytest.raises(EnvError, match="setup"):
        env.reset(task={"files": {"a.txt": "x"}, "setup_commands": [["false"]]})


def test_registered_env_draws_a_builtin_task_from_the_seed():
    with make("sandbox") as first, make("sandbox") as second:
        assert first.domain == "coding" and first.terminal_tools == {"submit"}
        a, b = first.reset(seed=3), second.reset(seed=3)
        assert a.observation == b.observation and a.info["task_id"] in {
            t.task_id for t in builtin_tasks("sandbox")
        }


def test_options_that_do_not_apply_to_the_backend_are_refused_not_dropped():
    from producers.sandbox.local import Limits

    with pytest.raises(EnvError, match=r"limits: .*backend 'docker'"):
        SandboxEnv(backend="docker", limits=Limits())
    with pytest.raises(EnvError, match=r"docker_host, image: .*backend 'local'"):
        SandboxEnv(backend="local", docker_host="unix:///nonexistent/docker.sock")
    with pytest.raises(EnvError, match="unisolated: expected true or false"):
        SandboxEnv(unisolated="yes")


def test_limits_from_json_are_checked_and_used():
    env = SandboxEnv(backend="local", limits={"timeout_s": 7, "processes": 32})
    assert (env.limits.timeout_s, env.limits.processes) == (7, 32)
    with pytest.raises(EnvError, match=r"limits: unknown field\(s\) \['walltime'\]"):
        SandboxEnv(limits={"walltime": 5})
    with pytest.raises(EnvError, match=r"limits: .*processes"):
        SandboxEnv(limits={"processes": -1})


def test_auto_is_decided_once_so_the_verdict_runs_on_the_agents_backend(task):
    with SandboxEnv(backend="auto") as env:
        env.reset(task=task)
        assert env.backend == env.sandbox.isolation["backend"] == "local"  # bubblewrap comes first

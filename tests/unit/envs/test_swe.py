"""SWE-style instance files: loading (JSON list and JSON Lines, errors naming line and field) and
SandboxEnv.reset on a local git snapshot checked out at base_commit."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from producers.envs import EnvError, SandboxEnv, load_swe_instances

GIT = shutil.which("git")
BUGGY = "def add(a, b):\n    return abs(a) + abs(b)\n"
TEST = "from calc import add\nassert add(-2, 5) == 3, add(-2, 5)\n"


def git(repo, *args):
    argv = ["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t", *args]
    return subprocess.run(argv, cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def snapshot(tmp_path):
    """A repo with two commits: the base (buggy add + test) and a later one the agent must not see."""
    if GIT is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "snap"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "calc.py").write_text(BUGGY)
    (repo / "test_calc.py").write_text(TEST)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "later.txt").write_text("from the future\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "later")
    return repo, base


def instance(**fields):
    row = {
        "instance_id": "demo__calc-1",
        "repo": "demo/calc",
        "problem_statement": "add() drops the sign of negative numbers.",
        "snapshot_dir": "snap",
        "test_command": ["python3", "test_calc.py"],
    }
    return {**row, **fields}


def test_reset_copies_the_snapshot_at_base_commit(tmp_path, snapshot):
    repo, base = snapshot
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(instance(base_commit=base)) + "\n")
    [task] = load_swe_instances(path)
    assert task.task_id == "demo__calc-1" and task.env == "sandbox"
    assert task.task["snapshot_dir"] == str(repo.resolve())
    with SandboxEnv(backend="local") as env:
        ts = env.reset(task=task.reset_task)
        assert "drops the sign" in ts.observation and ts.info["files"] == ["calc.py", "test_calc.py"]
        assert env.step({"tool": "file_read", "params": {"path": "calc.py"}}).observation == BUGGY
        head = env.step({"tool": "git", "params": {"subcommand": "rev-parse", "args": ["HEAD"]}})
        assert head.observation.strip() == base
        assert env.verify() is False
        env.step(
            {
                "tool": "file_write",
                "params": {"path": "calc.py", "content": "def add(a, b):\n    return a + b\n"},
            }
        )
        env.step({"tool": "submit", "params": {}})
        assert env.verify() is True
    assert (repo / "later.txt").exists()  # the snapshot itself is untouched


def test_json_list_and_fail_to_pass(tmp_path, snapshot):
    path = tmp_path / "instances.json"
    row = instance(FAIL_TO_PASS='["test_calc.py::test_add"]', test_command=None)
    path.write_text(json.dumps([row]))
    [task] = load_swe_instances(path)
    assert task.task["test_command"][:4] == ["python3", "-m", "pytest", "-q"]
    assert task.task["test_command"][-1] == "test_calc.py::test_add"  # each id must be reported PASSED
    assert "-rfEsp" in task.task["test_command"] and task.task["FAIL_TO_PASS"] == ["test_calc.py::test_add"]


def test_gold_patch_is_kept_as_reference_patch_and_never_reaches_the_env(tmp_path, snapshot):
    _, base = snapshot
    gold = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n"
    gold += " def add(a, b):\n-    return abs(a) + abs(b)\n+    return a + b\n"
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(instance(base_commit=base, patch=gold)) + "\n")
    [task] = load_swe_instances(path)
    assert task.task["reference_patch"] == gold and "patch" not in task.task
    with SandboxEnv(backend="local") as env:
        ts = env.reset(task=task.reset_task)
        assert "reference_patch" not in env.task and "return a + b" not in ts.observation + repr(ts.info)


def test_test_patch_is_applied_before_the_verdict(tmp_path, snapshot):
    _, base = snapshot
    patch = (
        "diff --git a/test_calc.py b/test_calc.py\n--- a/test_calc.py\n+++ b/test_calc.py\n"
        "@@ -1,2 +1,3 @@\n from calc import add\n assert add(-2, 5) == 3, add(-2, 5)\n"
        "+assert add(1, 1) == 3\n"
    )
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(instance(base_commit=base, test_patch=patch)) + "\n")
    [task] = load_swe_instances(path)
    with SandboxEnv(backend="local") as env:
        env.reset(task=task.reset_task)
        env.step(
            {
                "tool": "file_write",
                "params": {"path": "calc.py", "content": "def add(a, b):\n    return a + b\n"},
            }
        )
        env.step({"tool": "submit", "params": {}})
        assert env.verify() is False  # the patched-in test (1 + 1 == 3) fails


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (instance(instance_id=""), r"instances.jsonl:2: field 'instance_id'"),
        ({k: v for k, v in instance().items() if k != "problem_statement"}, r":2: field 'problem_statement'"),
        (instance(snapshot_dir="missing"), r":2: field 'snapshot_dir'.*not a directory"),
        (instance(test_command=None), r":2: needs field 'test_command' or a non-empty 'FAIL_TO_PASS'"),
        (instance(test_command=[1]), r":2: field 'test_command'"),
        (instance(base_commit=7), r":2: field 'base_commit'"),
        (instance(patch=["diff"]), r":2: field 'patch'"),
        (["not", "an", "object"], r":2: expected a JSON object"),
    ],
)
def test_bad_instance_names_the_line_and_field(tmp_path, snapshot, row, message):
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(instance(instance_id="ok")) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(EnvError, match=message):
        load_swe_instances(path)


def test_bad_json_repeats_and_unknown_base_commit(tmp_path, snapshot):
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(instance()) + "\n\n{oops\n")
    with pytest.raises(EnvError, match=r"instances.jsonl:3: not valid JSON"):
        load_swe_instances(path)
    path.write_text(json.dumps(instance()) + "\n" + json.dumps(instance()) + "\n")
    with pytest.raises(EnvError, match=r":2: instance_id 'demo__calc-1' repeats .*:1"):
        load_swe_instances(path)
    list_path = tmp_path / "instances.json"
    list_path.write_text(json.dumps([instance(), {"instance_id": "x"}]))
    with pytest.raises(EnvError, match=r"instances.json\[1\]: field 'problem_statement'"):
        load_swe_instances(list_path)
    with pytest.raises(EnvError, match="cannot be read"):
        load_swe_instances(tmp_path / "absent.jsonl")
    path.write_text(json.dumps(instance(base_commit="0" * 40)) + "\n")
    [task] = load_swe_instances(path)
    with SandboxEnv(backend="local") as env, pytest.raises(EnvError, match="checkout"):
        env.reset(task=task.reset_task)

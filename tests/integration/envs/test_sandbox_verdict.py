"""SandboxEnv.verify() cannot be gamed: on the real local sandbox with real git and pytest, an agent
that games its own workspace (a conftest.py that skips every test, a pytest.ini that only collects,
a module that shadows the one under test, edited tests, a skip raised from the code) is judged
failed, the real fix passes, and a SWE-style fix that breaks a PASS_TO_PASS test fails.

Each attack is first shown to work in the agent's own workspace, so the verdict is what stops it.
pytest is vendored into the task repository (the sandbox's python3 is the system one, which need not
have it), as a task's repository would ship or install its test runner.
"""

from __future__ import annotations

import doctest
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from producers.envs import SandboxEnv, sandbox_verdict
from producers.envs.sandbox_env import parse_sandbox_task
from producers.envs.sandbox_verdict import VerdictRefused, decide
from producers.sandbox.local import LocalSandbox

GIT = shutil.which("git")
VENDORED = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py.py")
BUGGY = (
    "def last_n(items, n):\n    if n <= 0:\n        return []\n    return items[-n + 1 :]\n\n\n"
    "def first_n(items, n):\n    return items[: max(n, 0)]\n"
)
FIXED = BUGGY.replace("items[-n + 1 :]", "items[-n:]")
FIX_THAT_BREAKS_FIRST_N = FIXED.replace("items[: max(n, 0)]", "items[1 : max(n, 0)]")
TESTS = (
    "from listutil import first_n, last_n\n\n\n"
    "def test_last_two():\n    assert last_n([1, 2, 3, 4], 2) == [3, 4]\n\n\n"
    "def test_first():\n    assert first_n([1, 2, 3], 2) == [1, 2]\n"
)
# Shipped by the task: puts src/ on sys.path (pytest then puts tests/ in front of it).
ROOT_CONFTEST = (
    "import os\nimport sys\n\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), 'src'))\n"
)
SKIP_ALL = (
    "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n"
    "    for item in items:\n        item.add_marker(pytest.mark.skip(reason='nope'))\n"
)
# Imported by the test run, each turns a failing run into a passing one.
NO_OP_RUNTEST = "import _pytest.python\n\n_pytest.python.Function.runtest = lambda self: None\n"
EXIT_0 = "import atexit, os; atexit.register(lambda: os._exit(0))\n"  # one line: a .pth runs it too
# HOME is the workspace, so the sandbox python's user site is in it (all its files are the agent's).
USER_SITE = f".local/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
FAKE_MODULE = "def last_n(items, n):\n    return [3, 4]\n\n\ndef first_n(items, n):\n    return [1, 2]\n"
TEST_COMMAND = ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]


def git(repo: Path, *args: str) -> str:
    argv = ["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t", *args]
    return subprocess.run(argv, cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A task repository at its base commit: src/listutil.py (last_n is off by one), its tests,
    the task's root conftest.py and a vendored pytest."""
    if GIT is None:
        pytest.skip("git is not installed")
    root = tmp_path_factory.mktemp("task") / "repo"
    site = Path(pytest.__file__).parent.parent
    for name in VENDORED:
        source = site / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            root.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, root / name)
    (root / "src").mkdir()
    (root / "src" / "listutil.py").write_text(BUGGY)
    (root / "tests").mkdir()
    (root / "tests" / "test_listutil.py").write_text(TESTS)
    (root / "conftest.py").write_text(ROOT_CONFTEST)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    return root, git(root, "rev-parse", "HEAD")


@pytest.fixture
def task(repo):
    root, base = repo
    return {
        "task_id": "last-n",
        "instruction": "last_n drops one item; fix src/listutil.py.",
        "snapshot_dir": str(root),
        "base_commit": base,
        "test_command": TEST_COMMAND,
    }


@pytest.fixture
def env():
    with SandboxEnv(backend="local") as sandbox_env:
        yield sandbox_env


def act(env, tool, **params):
    return env.step({"tool": tool, "params": params})


def play(env, task, writes, command=TEST_COMMAND):
    """Reset, write `writes` (path -> text), show what `command` does in the agent's own
    workspace (its exit code), then submit: (exit code there, reward)."""
    env.reset(task=task)
    for path, content in writes.items():
        assert act(env, "file_write", path=path, content=content).info["exit_code"] == 0
    own = act(env, "shell", command=command).info["exit_code"]
    return own, act(env, "submit").reward


def test_the_real_fix_passes_and_the_verdict_is_cached(env, task):
    assert play(env, task, {"src/listutil.py": FIXED}) == (0, 1.0)
    env.sandbox.run("file_write", {"path": "src/listutil.py", "content": BUGGY})
    assert env.verify() is True  # decided once the episode ended


def test_no_fix_fails(env, task):
    assert play(env, task, {}) == (1, 0.0)


ATTACKS = {
    "conftest.py that skips every test": {"tests/conftest.py": SKIP_ALL},
    "the task's conftest.py edited to skip every test": {"conftest.py": ROOT_CONFTEST + SKIP_ALL},
    "pytest.ini that only collects": {"pytest.ini": "[pytest]\naddopts = --collect-only\n"},
    "setup.cfg that only collects": {"setup.cfg": "[tool:pytest]\naddopts = --collect-only\n"},
    "a module that shadows the one under test": {"tests/listutil.py": FAKE_MODULE},
    "a package that shadows the one under test": {"tests/listutil/__init__.py": FAKE_MODULE},
    "the tests edited": {"tests/test_listutil.py": "def test_nothing():\n    pass\n"},
    "a new test module that patches the code under test": {
        "tests/test_aaa.py": "import listutil\n\nlistutil.last_n = lambda items, n: items[-n:]\n"
    },
    "an __init__.py in the tests that makes every test pass": {"tests/__init__.py": NO_OP_RUNTEST},
    "an __init__.py in the tests that ends the run with success": {
        "tests/__init__.py": "import os\n\nos._exit(0)\n"
    },
    "a pytest11 entry point in an added dist-info": {
        "evil-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = evilplug\n",
        "evil-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
        "evilplug.py": NO_OP_RUNTEST,
    },
    "a .pth in the user site": {f"{USER_SITE}/evil.pth": EXIT_0},
    "a usercustomize.py in the user site": {f"{USER_SITE}/usercustomize.py": EXIT_0},
}


@pytest.mark.parametrize("writes", ATTACKS.values(), ids=ATTACKS.keys())
def test_gaming_the_workspace_is_judged_failed(env, task, writes, caplog):
    caplog.set_level(logging.INFO, logger="producers.envs.sandbox_verdict")
    own_exit, reward = play(env, task, writes)
    assert own_exit == 0  # the attack works in the agent's own workspace ...
    assert reward == 0.0 and env.verify() is False  # ... and not in the verdict's
    assert "do not count" in caplog.text and next(iter(writes)) in caplog.text


def test_edited_tests_pass_only_with_the_real_fix(env, task):
    weak = "from listutil import last_n\n\n\ndef test_last_two():\n    assert last_n([1, 2, 3, 4], 2)\n"
    assert play(env, task, {"tests/test_listutil.py": weak}) == (0, 0.0)
    assert play(env, task, {"tests/test_listutil.py": weak, "src/listutil.py": FIXED}) == (0, 1.0)


@pytest.mark.parametrize("helper_path", ["src/listtail.py", "src/listtail/__init__.py"])
def test_a_legitimate_new_module_or_package_counts(env, task, helper_path):
    helper = "def tail(items, n):\n    return items[len(items) - n :]\n"
    fixed = "from listtail import tail\n\n\n" + FIXED.replace("items[-n:]", "tail(items, n)")
    assert play(env, task, {helper_path: helper, "src/listutil.py": fixed}) == (0, 1.0)


def test_checks_run_without_plugin_autoload_or_bytecode(env, task):
    probe = 'test "$PYTEST_DISABLE_PLUGIN_AUTOLOAD" = 1 && test "$PYTHONDONTWRITEBYTECODE" = 1'
    assert play(env, {**task, "test_command": probe}, {}, probe) == (1, 1.0)  # not set for the agent


def test_a_plugin_entry_point_is_not_loaded_even_if_it_were_kept(env, task, monkeypatch):
    keep = sandbox_verdict.protected_reason
    monkeypatch.setattr(
        sandbox_verdict, "protected_reason", lambda p, *a: None if ".dist-info/" in p else keep(p, *a)
    )
    assert play(env, task, ATTACKS["a pytest11 entry point in an added dist-info"]) == (0, 0.0)


def test_doctests():
    result = doctest.testmod(sandbox_verdict)
    assert result.attempted > 0 and result.failed == 0


def test_binary_and_non_utf8_changes_arrive_intact(env, task):
    data_task = {
        **task,
        "test_command": [
            "python3",
            "-c",
            "import sys; sys.exit(open('blob.bin','rb').read() != bytes(range(256))"
            " or open('latin.txt','rb').read() != 'caf\\u00e9\\n'.encode('latin-1'))",
        ],
    }
    env.reset(task=data_task)
    write = "open('blob.bin','wb').write(bytes(range(256))); open('latin.txt','wb').write(b'caf\\xe9\\n')"
    assert act(env, "shell", command=["python3", "-c", write]).info["exit_code"] == 0
    assert act(env, "submit").reward == 1.0


def test_a_workspace_without_its_repository_is_judged_failed(env, task, caplog):
    caplog.set_level(logging.INFO, logger="producers.envs.sandbox_env")
    env.reset(task=task)
    act(env, "file_write", path="src/listutil.py", content=FIXED)
    act(env, "shell", command=["rm", "-rf", ".git"])
    assert act(env, "submit").reward == 0.0
    assert "the agent's diff could not be taken" in caplog.text


def test_a_diff_that_does_not_apply_is_refused_with_its_reason(task):
    bad = b"diff --git a/src/listutil.py b/src/listutil.py\n--- a/src/listutil.py\n+++ b/src/listutil.py\n"
    bad += b"@@ -1,1 +1,1 @@\n-not what the file holds\n+x = 1\n"
    with pytest.raises(VerdictRefused, match="the agent's diff does not apply"):
        decide(LocalSandbox, parse_sandbox_task(task), bad)


def swe_task(task, **fields):
    swe = {k: v for k, v in task.items() if k != "test_command"}
    return {**swe, "FAIL_TO_PASS": '["tests/test_listutil.py::test_last_two"]', **fields}


def test_swe_fix_that_breaks_pass_to_pass_fails(env, task, caplog):
    caplog.set_level(logging.INFO, logger="producers.envs.sandbox_verdict")
    swe = swe_task(task, PASS_TO_PASS=["tests/test_listutil.py::test_first"])
    assert play(env, swe, {"src/listutil.py": FIX_THAT_BREAKS_FIRST_N}, ["true"])[1] == 0.0
    assert "PASS_TO_PASS check failed" in caplog.text
    assert play(env, swe, {"src/listutil.py": FIXED}, ["true"])[1] == 1.0


def test_swe_skip_raised_from_the_code_is_not_a_pass(env, task, caplog):
    caplog.set_level(logging.INFO, logger="producers.envs.sandbox_verdict")
    skipping = "import pytest\n\n\n" + BUGGY.replace(
        "    if n <= 0:", "    pytest.skip('no')\n    if n <= 0:"
    )
    command = [*TEST_COMMAND[:-1], "tests/test_listutil.py::test_last_two"]
    assert play(env, swe_task(task), {"src/listutil.py": skipping}, command) == (0, 0.0)
    assert "not reported PASSED: ['tests/test_listutil.py::test_last_two']" in caplog.text

"""The verdict of a `SandboxEnv` task, decided where the agent cannot reach.

The agent's workspace is never trusted: it may hold a `conftest.py` that skips every test, a
`sitecustomize.py`, a module that shadows the one under test, or edited tests. So the verdict is
taken in a second, fresh workspace of the same sandbox backend:

1. `prepare_workspace` builds it from the task exactly as `reset()` built the agent's (the snapshot
   at `base_commit`, the task's files, its setup commands, committed as the base).
2. `agent_patch` takes the agent's changes as a binary-safe `git diff --binary` of its whole
   workspace (untracked files included; `.gitignore`d files, bytecode and `.pytest_cache` not)
   against the base commit recorded at reset, computed inside the agent's sandbox with a
   throwaway index (replace refs ignored) and carried as base64.
3. The patch is applied with `git apply`; one that does not apply fails the task, reason logged.
4. `protected_reason` decides which of the resulting changes do not count; those paths are put
   back as the task shipped them (`git checkout <base> -- path`), or removed when the task had
   none. Then the task's `test_files` are rewritten and its `test_patch` applied.
5. The checks run: the test command (the FAIL_TO_PASS check) must exit 0, and a task listing
   PASS_TO_PASS ids must still pass them (pytest). Where a check is a pytest run of listed ids,
   every id must be reported PASSED: a skipped or uncollected test is not a pass. Every check runs
   under `env PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1` (`CHECK_ENV`): no pytest
   plugin is loaded from package metadata (the workspace is on `sys.path`), so a task that needs an
   installed plugin names it in its test_command (`-p module`).

What still runs in the check is the code the agent legitimately changed: when the tests import it,
it can patch the test runner in-process. That cannot be closed here (see docs/security.md).

It must not run git or any other tool on the agent's files outside a sandbox.
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from producers.envs.errors import EnvError
from producers.sandbox.base import Sandbox, ToolResult, shell_argv

log = logging.getLogger(__name__)

GIT_IDENTITY = (("user.email", "sandbox@agentstream.invalid"), ("user.name", "agentstream sandbox"))
TEST_TIMEOUT_S = 120.0
AGENT_PATCH_PATH = ".git/agentstream-agent.patch"
TEST_PATCH_PATH = ".git/agentstream-test.patch"
PYTEST_PREFIX = ("python3", "-m", "pytest", "-q")
PYTEST_REPORT_OPTIONS = ("-rfEsp", "-p", "no:cacheprovider")
CHECK_ENV = ("PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", "PYTHONDONTWRITEBYTECODE=1")

# Files that change how tests are collected or run rather than what the code does: an agent's
# change to one never counts, wherever it sits (pytest finds ini files in any parent directory of
# its arguments, and conftest.py files in every directory it visits).
TEST_CONFIG_NAMES = frozenset(
    {
        "conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "pytest.toml",
        ".pytest.toml",
        "sitecustomize.py",
        "usercustomize.py",
    }
)
# Directories named like this hold tests; the innermost one above a test file is the task's.
TEST_DIR_NAMES = frozenset({"tests", "test", "testing"})
# Package metadata (entry points: pytest plugins) and files `site` runs at startup.
METADATA_SUFFIXES = (".dist-info", ".egg-info")
STARTUP_SUFFIXES = (".pth", ".egg-link")
# Modules an added file may not shadow: the standard library, the test runners and what they import.
RUNNER_MODULES = frozenset(
    {"pytest", "_pytest", "pluggy", "py", "iniconfig", "nose", "nose2", "attr", "attrs", "packaging"}
    | {"pygments", "exceptiongroup", "tomli", "colorama", "importlib_metadata"}
)
SHADOWED_MODULES = frozenset(sys.stdlib_module_names) | RUNNER_MODULES | {"sitecustomize", "usercustomize"}
MODULE_SUFFIXES = (".py", ".pyw", ".pyc", ".so", ".pyd")

# Run inside the agent's sandbox: its index is left alone (a throwaway one is built), the diff is
# forced into a plain, applicable form whatever the workspace's git config says. Bytecode and test
# caches (what running the tests leaves behind) are never taken: they would not count anyway. What git prints
# on the way (warnings: stderr is merged into the output) comes before the marker line.
AGENT_DIFF_SCRIPT = r"""set -e
index=$(mktemp); out=$(mktemp); rm -f "$index"
trap 'rm -f "$index" "$out"' EXIT
export GIT_NO_REPLACE_OBJECTS=1
GIT_INDEX_FILE=$index git add -A -- . ':(exclude,glob)**/__pycache__/**' ':(exclude,glob)**/*.py[co]' \
  ':(exclude,glob)**/.pytest_cache/**'
GIT_INDEX_FILE=$index git diff --cached --binary --full-index --no-renames --no-color --no-ext-diff \
  --no-textconv --no-relative --src-prefix=a/ --dst-prefix=b/ "$1" -- >"$out"
echo "$PATCH_MARKER"
base64 "$out"
"""
PATCH_MARKER = "--- agentstream: agent patch in base64 follows ---"


class VerdictRefused(EnvError):
    """The verdict is False for a reason that is not a test result (logged with the task id)."""


@dataclass(frozen=True)
class Check:
    """One test run of the verdict: `command` must exit 0 and report every id in `ids` PASSED."""

    name: str
    command: list[str] | str
    ids: tuple[str, ...] = ()


def pytest_command(ids: Iterable[str]) -> list[str]:
    """The pytest run of test ids that reports each passed id in its summary.

    >>> pytest_command(["t.py::a"])
    ['python3', '-m', 'pytest', '-q', '-rfEsp', '-p', 'no:cacheprovider', 't.py::a']
    """
    return [*PYTEST_PREFIX, *PYTEST_REPORT_OPTIONS, *ids]


def guarded(command: list[str] | str) -> list[str]:
    """A check's command as it runs: under `CHECK_ENV` (a str is run by `/bin/sh -c`).

    >>> guarded("make test")[-4:]
    ['PYTHONDONTWRITEBYTECODE=1', '/bin/sh', '-c', 'make test']
    >>> guarded(["python3", "t.py"])
    ['env', 'PYTEST_DISABLE_PLUGIN_AUTOLOAD=1', 'PYTHONDONTWRITEBYTECODE=1', 'python3', 't.py']
    """
    return ["env", *CHECK_ENV, *shell_argv(command)]


def checks_of(task: dict[str, Any]) -> list[Check]:
    """The checks of a parsed task: its test command (FAIL_TO_PASS), then PASS_TO_PASS.

    >>> [c.name for c in checks_of({"test_command": "true", "FAIL_TO_PASS": [], "PASS_TO_PASS": ["t::a"]})]
    ['FAIL_TO_PASS', 'PASS_TO_PASS']
    """
    checks = []
    if task["test_command"] is not None:
        fail_to_pass = tuple(task["FAIL_TO_PASS"])
        derived = fail_to_pass and task["test_command"] == pytest_command(fail_to_pass)
        checks.append(Check("FAIL_TO_PASS", task["test_command"], fail_to_pass if derived else ()))
    if task["PASS_TO_PASS"]:
        checks.append(
            Check("PASS_TO_PASS", pytest_command(task["PASS_TO_PASS"]), tuple(task["PASS_TO_PASS"]))
        )
    return checks


def passed_ids(output: str) -> set[str]:
    """The test ids a pytest run reported PASSED in its short summary (`-rp`).

    >>> sorted(passed_ids("..\\nPASSED t.py::a\\nSKIPPED [1] t.py:3: no\\nPASSED t.py::b[x y]\\n"))
    ['t.py::a', 't.py::b[x y]']
    """
    return {line[len("PASSED ") :].strip() for line in output.splitlines() if line.startswith("PASSED ")}


def protected_reason(path: str, base_paths: frozenset[str], test_paths: frozenset[str]) -> str | None:
    """Why the agent's change to `path` does not count, or None when it does.

    Never counts, added or changed: a test file (one the task names in `test_files`, `test_patch`
    or its test ids, or any `test_*.py` / `*_test.py`, added ones included: a new test module could
    patch the module under test when pytest imports it), a test configuration file, package
    metadata (`*.dist-info`, `*.egg-info`: entry points load pytest plugins), a `.pth` or
    `.egg-link`, and anything in the task's test directory (see `_test_dirs`: its `__init__.py`,
    which pytest imports before the tests, helpers, data). Never counts when added: compiled
    bytecode, an `__init__.py` in a directory above a test file (it makes that directory a package
    pytest imports), or a module in a directory that is no package (so possibly on `sys.path`)
    named like a standard library module, a test runner module or a module the task already has
    elsewhere.

    >>> base = frozenset({"src/calc.py", "tests/test_calc.py", "test_util.py", "util.py"})
    >>> protected_reason("tests/conftest.py", base, frozenset())
    'test configuration file conftest.py'
    >>> protected_reason("src/calc_test.py", base, frozenset())
    'a test file'
    >>> protected_reason("tests/__init__.py", base, frozenset())
    "in the task's test directory tests/"
    >>> protected_reason("__init__.py", base, frozenset())
    'an added __init__.py above test files'
    >>> protected_reason("x-1.0.dist-info/entry_points.txt", base, frozenset())
    'package metadata, .pth or .egg-link file'
    >>> [protected_reason(p, base, frozenset()) for p in ("src/calc.py", "util.py", "src/new.py")]
    [None, None, None]
    >>> protected_reason("src/util.py", base, frozenset())
    "module 'util' shadows a module of the task or of Python"
    """
    parts = PurePosixPath(path).parts
    name = parts[-1]
    reason = _never_counts(path, parts, base_paths, test_paths)
    if reason is not None or path in base_paths:
        return reason
    if name.endswith((".pyc", ".pyo")) or "__pycache__" in parts:
        return "added bytecode"
    if name.startswith("__init__.") and "/".join(parts[:-1]) in _test_dirs(base_paths, test_paths)[1]:
        return "an added __init__.py above test files"
    module = _module_name(parts)
    if module is None or _in_package(parts, base_paths):
        return None
    if module in SHADOWED_MODULES or module in _top_level_modules(base_paths):
        return f"module {module!r} shadows a module of the task or of Python"
    return None


def _never_counts(
    path: str, parts: tuple[str, ...], base_paths: frozenset[str], test_paths: frozenset[str]
) -> str | None:
    """Why a change to `path` never counts, added or changed (see `protected_reason`)."""
    name = parts[-1]
    if path in test_paths:
        return "a test file of the task"
    if _is_test_file(name):
        return "a test file"
    if name in TEST_CONFIG_NAMES:
        return f"test configuration file {name}"
    if name.endswith(STARTUP_SUFFIXES) or any(part.endswith(METADATA_SUFFIXES) for part in parts):
        return "package metadata, .pth or .egg-link file"
    owned = _test_dirs(base_paths, test_paths)[0]
    for depth in range(1, len(parts)):
        if "/".join(parts[:depth]) in owned:
            return f"in the task's test directory {'/'.join(parts[:depth])}/"
    return None


def _is_test_file(name: str) -> bool:
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


@functools.lru_cache(maxsize=8)
def _test_dirs(
    base_paths: frozenset[str], test_paths: frozenset[str]
) -> tuple[frozenset[str], frozenset[str]]:
    """(the task's test directories, every directory holding a test file or above one; "" is the
    root). A directory holding a test file (a path of `test_paths` or a base `test_*.py`) is the
    task's up to the innermost enclosing `tests`/`test`/`testing` directory, or on its own when
    none of the base's modules in it is code (only tests, `conftest.py`, `__init__.py`). The root,
    or a directory of code with tests beside it, is never the task's: code there is the agent's."""
    files = test_paths | {p for p in base_paths if _is_test_file(PurePosixPath(p).name)}
    holding = {PurePosixPath(p).parent.parts for p in files}
    code_dirs = {
        PurePosixPath(p).parent.parts
        for p in base_paths
        if p.endswith(".py")
        and PurePosixPath(p).name not in {"__init__.py", "conftest.py"}
        and not _is_test_file(PurePosixPath(p).name)
    }
    owned, above = set(), set()
    for parts in holding:
        above.update("/".join(parts[:depth]) for depth in range(len(parts) + 1))
        named = [depth for depth in range(1, len(parts) + 1) if parts[depth - 1] in TEST_DIR_NAMES]
        if named:
            owned.add("/".join(parts[: named[-1]]))
        elif parts and parts not in code_dirs:
            owned.add("/".join(parts))
    return frozenset(owned), frozenset(above)


def _module_name(parts: tuple[str, ...]) -> str | None:
    """The name a file is imported by from its directory (a package's from its parent's)."""
    if not parts[-1].endswith(MODULE_SUFFIXES):
        return None
    stem = parts[-1].split(".", 1)[0]
    if stem == "__init__":
        return parts[-2] if len(parts) > 1 else None
    return stem


def _in_package(parts: tuple[str, ...], base_paths: frozenset[str]) -> bool:
    """Whether the directory that imports this file by name is a package of the task (then the
    name is qualified and shadows nothing)."""
    home = parts[:-2] if parts[-1].startswith("__init__.") else parts[:-1]
    return bool(home) and "/".join((*home, "__init__.py")) in base_paths


@functools.lru_cache(maxsize=8)
def _top_level_modules(base_paths: frozenset[str]) -> frozenset[str]:
    names = set()
    for path in base_paths:
        parts = PurePosixPath(path).parts
        module = _module_name(parts)
        if module is not None and not _in_package(parts, base_paths):
            names.add(module)
    return frozenset(names)


def patch_paths(patch: str) -> set[str]:
    """The paths a unified diff touches (`--- a/x`, `+++ b/x`; /dev/null left out).

    >>> sorted(patch_paths("--- a/t.py\\n+++ b/t.py\\n@@ -1 +1 @@\\n--- /dev/null\\n+++ b/new.py\\n"))
    ['new.py', 't.py']
    """
    found = set()
    for match in re.finditer(r"^(?:---|\+\+\+) (?:[ab]/)?(\S.*?)\t?$", patch, re.MULTILINE):
        if match.group(1) != "/dev/null":
            found.add(match.group(1))
    return found


# --- sandbox shell ---------------------------------------------------------------------------


def run_or_raise(sandbox: Sandbox, tool: str, params: dict[str, Any]) -> ToolResult:
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


def prepare_workspace(sandbox: Sandbox, task: dict[str, Any]) -> str | None:
    """Build the task's workspace in `sandbox` and commit it as the base: the base commit's id, or
    None when git does not work there. A failing step raises `EnvError`."""
    snapshot = task.get("snapshot_dir")
    sandbox.reset(Path(snapshot) if snapshot else None)
    if snapshot and task.get("base_commit"):
        run_or_raise(sandbox, "git", {"subcommand": "checkout", "args": ["-q", "-f", task["base_commit"]]})
    for path, content in {**task["files"], **task["test_files"]}.items():
        run_or_raise(sandbox, "file_write", {"path": path, "content": content})
    for command in task["setup_commands"]:
        run_or_raise(sandbox, "shell", {"command": command})
    if not _commit_base(sandbox):
        return None
    head = sandbox.run("git", {"subcommand": "rev-parse", "args": ["--verify", "-q", "HEAD"]})
    return head.output.strip() if head.ok else None


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


def agent_patch(sandbox: Sandbox, base: str) -> bytes:
    """The agent's changes against `base` as a binary git patch, computed in its own sandbox."""
    script = AGENT_DIFF_SCRIPT.replace("$PATCH_MARKER", PATCH_MARKER)
    result = sandbox.run("shell", {"command": ["/bin/sh", "-c", script, "sh", base]})
    if not result.ok:
        raise VerdictRefused(f"the agent's diff could not be taken: {result.output[-300:] or result.error}")
    _, marker, encoded = result.output.rpartition(PATCH_MARKER + "\n")
    try:  # strict: output cut at the sandbox's limit ends in a marker that is not base64
        if not marker:
            raise ValueError("no patch marker")
        return base64.b64decode("".join(encoded.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise VerdictRefused(
            f"the agent's diff came back cut or garbled ({exc}); is it over the output limit? "
            f"Output starts: {result.output[:300]!r}"
        ) from None


def decide(make_sandbox: Callable[[], Sandbox], task: dict[str, Any], patch: bytes) -> bool:
    """Apply `patch` to a fresh workspace of `task`, drop what does not count, run the checks."""
    with make_sandbox() as fresh:
        try:
            base = prepare_workspace(fresh, task)
        except EnvError as exc:
            raise VerdictRefused(f"the fresh workspace could not be built: {exc}") from None
        if base is None:
            raise VerdictRefused("git does not work in the sandbox, so the agent's diff cannot be applied")
        base_paths = frozenset(_nul_list(fresh, ["ls-tree", "-r", "-z", "--name-only", base]))
        if patch.strip():
            _apply(fresh, AGENT_PATCH_PATH, patch, "the agent's diff")
        _restore_protected(fresh, task, base, base_paths)
        return all(_passes(fresh, check, task) for check in checks_of(task))  # stops at the first


def _apply(sandbox: Sandbox, path: str, patch: bytes, what: str) -> None:
    """`git apply` a patch carried as base64 (binary-safe through the text-only file tool)."""
    encoded = base64.b64encode(patch).decode("ascii")
    wrote = sandbox.run("file_write", {"path": path + ".b64", "content": encoded})
    script = 'base64 -d "$1.b64" >"$1" && git apply --whitespace=nowarn "$1"'
    applied = sandbox.run("shell", {"command": ["/bin/sh", "-c", script, "sh", path]})
    if not (wrote.ok and applied.ok):
        detail = (applied.output or wrote.error or applied.error or "").strip()[-500:]
        raise VerdictRefused(f"{what} does not apply: {detail}")


def _restore_protected(sandbox: Sandbox, task: dict[str, Any], base: str, base_paths: frozenset[str]) -> None:
    """Put back every protected path as the task shipped it; then the task's own tests."""
    listed_ids = [*task["FAIL_TO_PASS"], *task["PASS_TO_PASS"]]
    test_paths = frozenset(
        {
            *task["test_files"],
            *patch_paths(task.get("test_patch") or ""),
            *(i.split("::")[0] for i in listed_ids),
        }
    )
    listed = _nul_list(sandbox, ["ls-files", "-z", "--cached", "--others"])
    changed = set(_nul_list(sandbox, ["diff", "--name-only", "-z", "--no-renames", base]))
    added = {p for p in listed if p not in base_paths}
    drop = sorted(p for p in added if protected_reason(p, base_paths, test_paths))
    restore = sorted(p for p in base_paths if protected_reason(p, base_paths, test_paths))
    ignored = sorted(set(drop) | (changed & set(restore)))
    if ignored:
        log.info("sandbox task %s: the agent's changes to %s do not count", task.get("task_id"), ignored)
    for chunk in _chunks(drop):
        _run_or_refuse(sandbox, "shell", {"command": ["rm", "-rf", "--", *chunk]})
    for chunk in _chunks(restore):
        _run_or_refuse(sandbox, "git", {"subcommand": "checkout", "args": ["-q", base, "--", *chunk]})
    for path, content in task["test_files"].items():
        _run_or_refuse(sandbox, "file_write", {"path": path, "content": content})
    if task.get("test_patch"):
        _apply(sandbox, TEST_PATCH_PATH, task["test_patch"].encode(), "the task's test_patch")


def _passes(sandbox: Sandbox, check: Check, task: dict[str, Any]) -> bool:
    result = sandbox.run("shell", {"command": guarded(check.command), "timeout_s": TEST_TIMEOUT_S})
    missing = set(check.ids) - passed_ids(result.output)
    if result.ok and not missing:
        return True
    why = f"not reported PASSED: {sorted(missing)}" if result.ok else f"exit {result.exit_code}"
    log.info(
        "sandbox task %s: %s check failed (%s): %s",
        task.get("task_id"),
        check.name,
        why,
        result.output[-500:],
    )
    return False


def _nul_list(sandbox: Sandbox, args: list[str]) -> list[str]:
    result = _run_or_refuse(sandbox, "git", {"subcommand": args[0], "args": args[1:]})
    return [p for p in result.output.split("\x00") if p]


def _run_or_refuse(sandbox: Sandbox, tool: str, params: dict[str, Any]) -> ToolResult:
    result = sandbox.run(tool, params)
    if not result.ok:
        raise VerdictRefused(
            f"verification step {tool} {params!r:.200} failed: {result.output[-300:] or result.error}"
        )
    return result


def _chunks(paths: list[str], size: int = 200) -> list[list[str]]:
    return [paths[i : i + size] for i in range(0, len(paths), size)]

"""`LocalSandbox`: the agent tools run as child processes in a private temp workspace.

Every command is an argv (never a formatted shell string) started with `start_new_session=True`,
under rlimits (CPU, address space, file size, process count) set in the child before `exec`, and
where the kernel allows it inside `unshare -rn --pid --fork --kill-child` (no network; a PID
namespace, so everything a command forks dies and is reaped with it). A wall-clock timeout SIGKILLs
the whole process group. Running as root, commands drop to uid 65534 so RLIMIT_NPROC applies (the
kernel never enforces it for root). What is actually enforced is in `LocalSandbox.isolation`.

It must not let a path leave the workspace: every path is resolved (symlinks too) and checked.
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producers.sandbox.base import Sandbox, ToolResult, git_argv, shell_argv, truncate
from producers.sandbox.errors import SandboxError

__all__ = ["Limits", "LocalSandbox"]

log = logging.getLogger(__name__)

UNPRIVILEGED_UID = 65534  # "nobody": RLIMIT_NPROC is not enforced for root
NAMESPACE_PREFIX = ["unshare", "-rn", "--pid", "--fork", "--kill-child", "--"]
MAX_SEARCH_FILE_BYTES = 2_000_000


@dataclass(frozen=True)
class Limits:
    """Resource limits of every command a `LocalSandbox` runs (per process, except `processes`)."""

    cpu_s: int = 30
    memory_mb: int = 512
    file_mb: int = 64
    processes: int = 64
    timeout_s: float = 60
    output_bytes: int = 1_000_000
    network: bool = False

    def __post_init__(self) -> None:
        for name in ("cpu_s", "memory_mb", "file_mb", "processes", "timeout_s", "output_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise SandboxError(f"Limits.{name} must be a positive number, got {value!r}")


@functools.lru_cache(maxsize=4)
def namespaces_available(uid: int | None) -> bool:
    """Whether `unshare -rn --pid --fork` works here for `uid` (probed once per uid)."""
    if shutil.which("unshare") is None:
        return False
    try:
        done = subprocess.run(
            [*NAMESPACE_PREFIX, "true"],
            user=uid,
            group=uid,
            extra_groups=[] if uid is not None else None,
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _user_process_count(uid: int) -> int:
    """Processes (zombies included) whose real uid is `uid`: what RLIMIT_NPROC counts."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(entry.path).st_uid == uid:
                    count += 1
            except OSError:
                continue
    return count


class LocalSandbox(Sandbox):
    """A private workspace under `root` (a temp dir by default); commands run under `limits`."""

    def __init__(self, root: Path | None = None, limits: Limits = Limits()):
        self.limits = limits
        self.uid = UNPRIVILEGED_UID if os.geteuid() == 0 else None
        self._base = Path(tempfile.mkdtemp(prefix="agentstream-sandbox-", dir=root)).resolve()
        os.chmod(self._base, 0o711)  # the unprivileged uid must reach its workspace
        self._check_reachable()
        self.workspace = self._base / "workspace"
        self._closed = False
        self.isolation = self._isolation()
        self.reset()

    def _check_reachable(self) -> None:
        """Running as root, commands run as uid 65534: every parent of the workspace must let it pass."""
        if self.uid is None:
            return
        for parent in self._base.parents:
            if not parent.stat().st_mode & 0o001:
                shutil.rmtree(self._base, ignore_errors=True)
                raise SandboxError(
                    f"sandbox root {parent} is not traversable by uid {self.uid} (mode "
                    f"{oct(parent.stat().st_mode & 0o777)}); pick a root under a world-traversable directory"
                )

    def _isolation(self) -> dict[str, Any]:
        """What this kernel and user let the sandbox enforce, with a reason where it cannot."""
        namespaces = namespaces_available(self.uid)
        info: dict[str, Any] = {
            "cpu": True,
            "memory": True,
            "file_size": True,
            "processes": True,
            "run_as_uid": self.uid if self.uid is not None else os.geteuid(),
            "run_as_gid": self.uid if self.uid is not None else os.getegid(),
            "namespaces": namespaces,
            "network": namespaces and not self.limits.network,
            "reason": None,
        }
        if not namespaces:
            info["reason"] = "`unshare -rn --pid --fork` is unavailable: no network isolation"
            if not self.limits.network:
                log.warning("sandbox: %s (workspace %s)", info["reason"], self.workspace)
        return info

    # --- workspace -----------------------------------------------------------------------------

    def reset(self, snapshot_dir: Path | None = None) -> None:
        """A fresh workspace: empty, or a copy of `snapshot_dir` (symlinks copied as links)."""
        self._check_open()
        self.submitted, self.answer = False, None
        if self.workspace.exists():
            shutil.rmtree(self.workspace)
        if snapshot_dir is None:
            self.workspace.mkdir()
        else:
            shutil.copytree(snapshot_dir, self.workspace, symlinks=True)
        self._give_to_sandbox_user(self.workspace, recursive=True)

    def snapshot(self, target: Path) -> Path:
        """Copy the workspace to `target` (which must not exist yet)."""
        self._check_open()
        shutil.copytree(self.workspace, target, symlinks=True)
        return Path(target)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            shutil.rmtree(self._base, ignore_errors=True)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self._base} is closed")

    def _give_to_sandbox_user(self, path: Path, recursive: bool = False) -> None:
        if self.uid is None:
            return
        paths = [path, *path.rglob("*")] if recursive else [path]
        for p in paths:
            os.lchown(p, self.uid, self.uid)

    def resolve(self, path: str) -> Path:
        """`path` resolved against the workspace (symlinks followed); refused if it leaves it."""
        if not isinstance(path, str) or "\x00" in path:
            raise SandboxError(f"path must be a str without NUL, got {path!r}")
        resolved = (self.workspace / path).resolve()
        if not resolved.is_relative_to(self.workspace):
            raise SandboxError(f"path {path!r} is outside the workspace {self.workspace}")
        return resolved

    # --- file tools ----------------------------------------------------------------------------

    def file_read(self, path: str, start_line: int | None = None, end_line: int | None = None) -> ToolResult:
        """A file's text, or lines start_line..end_line (1-based, inclusive)."""
        target = self.resolve(path)
        if not target.is_file():
            return ToolResult("", 1, f"file_read: {path!r} is not a file in the workspace")
        text = target.read_text(encoding="utf-8", errors="replace")
        if start_line is not None or end_line is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[max((start_line or 1) - 1, 0) : end_line])
        return ToolResult(truncate(text.encode(), self.limits.output_bytes), 0)

    def file_write(self, path: str, content: str, create_dirs: bool = True) -> ToolResult:
        """Write `content` (UTF-8); parents are created when `create_dirs`."""
        if not isinstance(content, str):
            raise SandboxError(f"file_write content must be a str, got {type(content).__name__}")
        if len(content.encode()) > self.limits.file_mb * 1024 * 1024:
            raise SandboxError(f"file_write content exceeds file_mb={self.limits.file_mb}")
        target = self.resolve(path)
        if not target.parent.is_dir():
            if not create_dirs:
                return ToolResult("", 1, f"file_write: directory of {path!r} does not exist")
            missing = [p for p in [target.parent, *target.parent.parents] if not p.exists()]
            target.parent.mkdir(parents=True)
            for created in missing:
                self._give_to_sandbox_user(created)
        target.write_text(content, encoding="utf-8")
        self._give_to_sandbox_user(target)
        return ToolResult(f"wrote {len(content)} characters to {path}", 0)

    def search(self, pattern: str, path: str = ".", file_pattern: str | None = None) -> ToolResult:
        """`relpath:lineno:line` for each line matching the regex (Python `re`, no grep)."""
        try:
            regex = re.compile(pattern)
        except (re.error, TypeError) as exc:
            raise SandboxError(f"search pattern {pattern!r} is not a regular expression: {exc}") from exc
        root = self.resolve(path)
        hits: list[str] = []
        for file in _walk_files(root):
            if file_pattern and not fnmatch.fnmatch(file.name, file_pattern):
                continue
            rel = file.relative_to(self.workspace)
            for lineno, line in enumerate(_text_lines(file), 1):
                if regex.search(line):
                    hits.append(f"{rel}:{lineno}:{line}")
        return ToolResult(truncate("\n".join(hits).encode(), self.limits.output_bytes), 0)

    # --- commands ------------------------------------------------------------------------------

    def shell(
        self, command: list[str] | str, timeout_s: float | None = None, work_dir: str | None = None
    ) -> ToolResult:
        """Run an argv, or a str as `/bin/sh -c <str>`; the timeout is capped at `limits.timeout_s`."""
        cwd = self.resolve(work_dir) if work_dir is not None else self.workspace
        timeout = min(timeout_s, self.limits.timeout_s) if timeout_s else self.limits.timeout_s
        return self.execute(shell_argv(command), timeout, cwd)

    def git(self, subcommand: str, args: list[str] | None = None) -> ToolResult:
        """Run `git <subcommand> <args...>` in the workspace."""
        return self.execute(git_argv(subcommand, args), self.limits.timeout_s, self.workspace)

    def execute(self, argv: list[str], timeout_s: float, cwd: Path) -> ToolResult:
        """Run `argv` under the limits; on timeout SIGKILL its whole process group."""
        self._check_open()
        start = time.monotonic()
        full = [*NAMESPACE_PREFIX, *argv] if self.isolation["namespaces"] else list(argv)
        try:
            proc = subprocess.Popen(
                full,
                cwd=cwd,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                user=self.uid,
                group=self.uid,
                extra_groups=[] if self.uid is not None else None,
                preexec_fn=self._preexec(),  # only setrlimit calls: safe after fork
            )
        except OSError as exc:
            return ToolResult("", 127, f"cannot start {argv[0]!r}: {exc}")
        reader = _OutputReader(proc, self.limits.output_bytes)
        timed_out = _wait(proc, timeout_s, self.isolation["namespaces"])
        _kill_group(proc)  # leftovers (background children) die with the command
        output = reader.result()
        duration = (time.monotonic() - start) * 1000.0
        return _result(output, proc.returncode, timed_out, timeout_s, duration)

    def _env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(self.workspace),
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
        }

    def _preexec(self) -> Callable[[], None]:
        """The closure the forked child runs before exec: set the rlimits, nothing else."""
        limits = self.limits
        nproc = limits.processes
        if self.uid is None:  # not root: RLIMIT_NPROC counts every process of this user
            nproc += _user_process_count(os.getuid())
        settings = [
            (resource.RLIMIT_CPU, limits.cpu_s),
            (resource.RLIMIT_AS, limits.memory_mb * 1024 * 1024),
            (resource.RLIMIT_FSIZE, limits.file_mb * 1024 * 1024),
            (resource.RLIMIT_NPROC, nproc),
        ]

        def apply() -> None:
            for which, value in settings:
                resource.setrlimit(which, (value, value))

        return apply


class _OutputReader:
    """Drains a pipe on a thread, keeping the first `limit` bytes (+1 to know it was cut)."""

    def __init__(self, proc: subprocess.Popen, limit: int):
        self._proc, self._limit, self._chunks, self._kept = proc, limit, [], 0
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        assert self._proc.stdout is not None
        while chunk := self._proc.stdout.read1(65536):
            if self._kept <= self._limit:
                self._chunks.append(chunk)
                self._kept += len(chunk)

    def result(self) -> str:
        self._thread.join(timeout=5)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        return truncate(b"".join(self._chunks), self._limit)


def _wait(proc: subprocess.Popen, timeout_s: float, namespaced: bool) -> bool:
    """Wait for the command; True when it ran past `timeout_s` (it is then killed)."""
    try:
        proc.wait(timeout=timeout_s)
        return False
    except subprocess.TimeoutExpired:
        if namespaced:
            _kill_namespace(proc)
        _kill_group(proc)
        proc.wait()
        return True


def _kill_namespace(proc: subprocess.Popen) -> None:
    """SIGKILL the PID namespace's init (unshare's child): the kernel then kills and reaps the
    whole namespace, and unshare reaps the init and exits. Killing unshare first would orphan
    the init to host PID 1, which may never reap it (a zombie that counts against RLIMIT_NPROC)."""
    for pid in _children(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        log.warning("sandbox: unshare pid %d did not exit after its namespace was killed", proc.pid)


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"{entry.path}/stat", encoding="ascii", errors="replace") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the command's process group until none of it is left (a fork bomb races us)."""
    for _ in range(200):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        if proc.poll() is None:
            time.sleep(0.005)
            continue
        time.sleep(0.001)


def _result(output: str, code: int, timed_out: bool, timeout_s: float, duration_ms: float) -> ToolResult:
    if timed_out:
        error = f"command timed out after {timeout_s}s; its process group was killed"
        return ToolResult(output, -signal.SIGKILL, error, True, duration_ms)
    error = None if code == 0 else f"command exited with code {code}"
    return ToolResult(output, code, error, False, duration_ms)


def _walk_files(root: Path) -> Iterator[Path]:
    if root.is_file():
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root):  # does not follow symlinked dirs
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if not path.is_symlink() and path.stat().st_size <= MAX_SEARCH_FILE_BYTES:
                yield path


def _text_lines(path: Path) -> list[str]:
    data = path.read_bytes()
    if b"\x00" in data[:8192]:
        return []  # binary
    return data.decode("utf-8", errors="replace").splitlines()

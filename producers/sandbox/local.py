"""`LocalSandbox`: the agent tools run inside one bubblewrap namespace per sandbox (per episode).

The host side only. At construction it starts `bwrap` (the view of the host is `bubblewrap`'s)
with `inside.py` as PID 1, and keeps that namespace for the sandbox's life; every tool call is one
request to that program over its stdin/stdout (see `inside`), so a call costs a fork and a pipe
round trip, not a new namespace. Running as root, the namespace runs as a uid of its own and in a
cgroup of its own (see `confinement`). What is actually enforced is in `LocalSandbox.isolation`.

It must never resolve an agent's path on the host filesystem (paths are checked inside), and it
treats everything coming back as hostile: bounded frames, parse errors are `SandboxError`, and a
program that stops answering is killed (the sandbox is then broken until `reset()`).

Without bubblewrap (or where it cannot create namespaces) it refuses, unless `unisolated=True`:
then the same `inside.py` runs directly on the host in a private temp dir, under rlimits and (as
root) a uid of its own, with NO filesystem, network or disk isolation, and says so.
"""

from __future__ import annotations

import logging
import re
import shutil
import signal
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from producers.sandbox.base import Sandbox, ToolResult, git_argv, shell_argv, truncate
from producers.sandbox.channel import ChannelError, extract_snapshot, send_tree
from producers.sandbox.errors import SandboxError
from producers.sandbox.namespace import BoundarySpec, start_boundary

__all__ = ["Limits", "LocalSandbox"]

log = logging.getLogger(__name__)

MIB = 1024 * 1024
ANSWER_MARGIN_S = 5.0  # how long past a command's timeout the host waits for the answer
OP_TIMEOUT_S = 300.0  # file tools, tar in and out
# The search tool, run inside like any command (`python3 -I -S`: the workspace is never on its
# import path). argv: WORKSPACE ROOT PATTERN GLOB; prints `relpath:lineno:line` per matching line.
SEARCH_PY = r"""import fnmatch, os, re, sys
ws, root, rx, glob = sys.argv[1], sys.argv[2], re.compile(sys.argv[3]), sys.argv[4]
def files():
    if not os.path.isdir(root):
        yield root
        return
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != ".git")
        for name in sorted(names):
            yield os.path.join(d, name)
for p in files():
    if glob and not fnmatch.fnmatch(os.path.basename(p), glob) or os.path.islink(p) or not os.path.isfile(p):
        continue
    try:
        with open(p, "rb") as f:
            data = f.read(2_000_001)
    except OSError:
        continue
    if len(data) > 2_000_000 or b"\0" in data[:8192]:
        continue
    rel = os.path.relpath(p, ws)
    for i, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if rx.search(line):
            sys.stdout.write(f"{rel}:{i}:{line}\n")
"""


@dataclass(frozen=True)
class Limits:
    """Limits of a `LocalSandbox`: per command process (cpu_s, memory_mb, file_mb), per sandbox
    (processes, workspace_mb, tmp_mb; memory_mb + the disk caps also bound the whole episode where
    a cgroup is available) and per call (timeout_s, output_bytes)."""

    cpu_s: int = field(default=30, metadata={"help": "CPU seconds of each command process"})
    memory_mb: int = field(default=512, metadata={"help": "address space of each command process"})
    file_mb: int = field(default=64, metadata={"help": "largest file a command or file_write writes"})
    processes: int = field(default=64, metadata={"help": "processes alive at once in the sandbox"})
    timeout_s: float = field(default=60, metadata={"help": "wall-clock cap of one command"})
    output_bytes: int = field(default=1_000_000, metadata={"help": "output kept per tool call"})
    network: bool = field(default=False, metadata={"help": "keep the host's network (no isolation)"})
    workspace_mb: int = field(default=1024, metadata={"help": "size cap of /workspace"})
    tmp_mb: int = field(default=256, metadata={"help": "size cap of /tmp"})
    shm_mb: int = field(default=64, metadata={"help": "size cap of /dev/shm"})

    def __post_init__(self) -> None:
        for name in (
            "cpu_s", "memory_mb", "file_mb", "processes", "timeout_s", "output_bytes",
            "workspace_mb", "tmp_mb", "shm_mb",
        ):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise SandboxError(f"Limits.{name} must be a positive number, got {value!r}")
        if not isinstance(self.network, bool):
            raise SandboxError(f"Limits.network must be a bool, got {self.network!r}")

    def rlimits(self) -> dict[str, int]:
        """What every command process gets (RLIMIT_NPROC counts the sandbox's own init too)."""
        return {
            "cpu": int(self.cpu_s),
            "as": int(self.memory_mb * MIB),
            "fsize": int(self.file_mb * MIB),
            "nproc": int(self.processes) + 1,
        }

    def boundary_spec(self) -> BoundarySpec:
        """The namespace these limits ask for. The episode's cgroup gets the processes' share of
        memory plus the tmpfs mounts they can fill, and room for the init program and bwrap."""
        return BoundarySpec(
            workspace_bytes=int(self.workspace_mb * MIB),
            tmp_bytes=int(self.tmp_mb * MIB),
            shm_bytes=int(self.shm_mb * MIB),
            network=self.network,
            pids_max=int(self.processes) + 4,
            memory_bytes=int((self.memory_mb + self.workspace_mb + self.tmp_mb + self.shm_mb + 64) * MIB),
            memory_mb=self.memory_mb,
        )


class LocalSandbox(Sandbox):
    """One bubblewrap namespace (see the module docstring); `close()` ends it and everything in it."""

    def __init__(self, limits: Limits = Limits(), *, unisolated: bool = False, bwrap: str = "bwrap"):
        if not isinstance(limits, Limits):
            raise SandboxError(f"limits must be a Limits, got {type(limits).__name__}")
        self.limits, self._unisolated, self._bwrap = limits, unisolated, bwrap
        self._lock = threading.Lock()
        self._boundary = start_boundary(limits.boundary_spec(), unisolated, bwrap)
        self._finalizer = weakref.finalize(self, self._boundary.close)
        self.workspace = Path(self._boundary.workspace)
        self.isolation = self._boundary.isolation

    # --- workspace -----------------------------------------------------------------------------

    def reset(self, snapshot_dir: Path | None = None) -> None:
        """A fresh workspace, empty or a copy of `snapshot_dir`; /tmp emptied; every process killed.
        A broken sandbox (its program stopped answering) is replaced by a new namespace here."""
        if snapshot_dir is not None and not Path(snapshot_dir).is_dir():
            raise SandboxError(f"reset: snapshot_dir {str(snapshot_dir)!r} is not a directory")
        with self._lock:
            if self._boundary.broken and not self._boundary.closed:
                self._boundary.close()
                self._boundary = start_boundary(self.limits.boundary_spec(), self._unisolated, self._bwrap)
                self._finalizer.detach()
                self._finalizer = weakref.finalize(self, self._boundary.close)
        self.submitted, self.answer = False, None
        if snapshot_dir is None:
            self._call({"op": "wipe"}, OP_TIMEOUT_S)
            return
        self._call({"op": "tar_in"}, OP_TIMEOUT_S, body=lambda ch: send_tree(ch, Path(snapshot_dir)))

    def snapshot(self, target: Path) -> Path:
        """The workspace copied to the new host dir `target` (modes kept, symlinks as links; a link
        that points outside `target` is left out with a warning)."""
        target = Path(target)
        if target.exists():
            raise SandboxError(f"snapshot: target {str(target)!r} already exists")
        target.mkdir(parents=True)
        limit = (2 * self.limits.workspace_mb + 64) * MIB
        try:
            reply, _ = self._call(
                {"op": "tar_out"}, OP_TIMEOUT_S, sink=lambda r: extract_snapshot(r, target), max_body=limit
            )
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        if reply.get("skipped"):
            log.warning("sandbox snapshot: unreadable, left out: %s", reply["skipped"])
        return target

    def close(self) -> None:
        """End the namespace and everything in it (and its uid, cgroup and temp dir)."""
        with self._lock:
            self._boundary.close()
        self._finalizer.detach()

    # --- tools ---------------------------------------------------------------------------------

    def file_read(self, path: str, start_line: int | None = None, end_line: int | None = None) -> ToolResult:
        """A file's text, or lines start_line..end_line (1-based, inclusive)."""
        for name, value in (("start_line", start_line), ("end_line", end_line)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise SandboxError(f"file_read {name} must be a positive int or None, got {value!r}")
        cap = self.limits.output_bytes
        request = {"op": "read", "path": path, "start_line": start_line, "end_line": end_line, "cap": cap}
        reply, body = self._call(request, OP_TIMEOUT_S, max_body=cap + 1)
        return _failed(reply) or ToolResult(truncate(body, cap), 0)

    def file_write(self, path: str, content: str, create_dirs: bool = True) -> ToolResult:
        """Write `content` (UTF-8); parents are created when `create_dirs`."""
        if not isinstance(content, str):
            raise SandboxError(f"file_write content must be a str, got {type(content).__name__}")
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise SandboxError(f"file_write content is not valid text: {exc}") from None
        if len(data) > self.limits.file_mb * MIB:
            raise SandboxError(f"file_write content exceeds file_mb={self.limits.file_mb}")
        request = {"op": "write", "path": path, "create_dirs": bool(create_dirs), "max_bytes": len(data)}
        reply, _ = self._call(request, OP_TIMEOUT_S, body=lambda ch: ch.send_body(data))
        return _failed(reply) or ToolResult(f"wrote {len(content)} characters to {path}", 0)

    def search(self, pattern: str, path: str = ".", file_pattern: str | None = None) -> ToolResult:
        """`relpath:lineno:line` for each line matching the regex (Python `re`), found by a program
        run inside under the command limits (a pattern that backtracks forever meets the timeout)."""
        try:
            re.compile(pattern)
        except (re.error, TypeError) as exc:
            raise SandboxError(f"search pattern {pattern!r} is not a regular expression: {exc}") from None
        if file_pattern is not None and not isinstance(file_pattern, str):
            raise SandboxError(f"search file_pattern must be a str or None, got {file_pattern!r}")
        reply, _ = self._call({"op": "check", "path": path}, OP_TIMEOUT_S)
        root = _failed(reply) or reply.get("path")
        if not isinstance(root, str):
            raise SandboxError(f"bad reply from the sandbox: {reply!r:.200}")
        argv = [
            "python3",
            "-I",
            "-S",
            "-c",
            SEARCH_PY,
            str(self.workspace),
            root,
            pattern,
            file_pattern or "",
        ]
        result = self._run({"op": "exec", "argv": argv, "cwd": "."}, self.limits.timeout_s)
        if result.output.endswith("\n"):  # one line per hit, joined (a cut output ends in its marker)
            result.output = result.output[:-1]
        if result.exit_code != 0 and not result.timed_out:
            result.error = f"search failed with code {result.exit_code}: {result.output[-300:]}"
        return result

    def shell(
        self, command: list[str] | str, timeout_s: float | None = None, work_dir: str | None = None
    ) -> ToolResult:
        """Run an argv, or a str as `/bin/sh -c <str>`; the timeout is capped at `limits.timeout_s`."""
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float)):
            raise SandboxError(f"shell timeout_s must be a number or None, got {timeout_s!r}")
        timeout = (
            min(timeout_s, self.limits.timeout_s) if timeout_s and timeout_s > 0 else self.limits.timeout_s
        )
        request = {"op": "exec", "argv": shell_argv(command), "cwd": "." if work_dir is None else work_dir}
        return self._run(request, timeout)

    def git(self, subcommand: str, args: list[str] | None = None) -> ToolResult:
        """Run `git <subcommand> <args...>` in the workspace."""
        return self._run(
            {"op": "exec", "argv": git_argv(subcommand, args), "cwd": "."}, self.limits.timeout_s
        )

    # --- the channel ---------------------------------------------------------------------------

    def _run(self, request: dict[str, Any], timeout_s: float) -> ToolResult:
        """An exec or search request under the limits; its reply as a ToolResult."""
        start = time.monotonic()
        cap = self.limits.output_bytes
        request = {**request, "timeout_s": timeout_s, "cap": cap, "rlimits": self.limits.rlimits()}
        try:
            reply, body = self._call(request, timeout_s + ANSWER_MARGIN_S, max_body=cap + 1)
        except _NoAnswer as exc:
            return ToolResult("", -signal.SIGKILL, str(exc), True, _ms(start))
        output, duration = truncate(body, cap), _ms(start)
        failed = _failed(reply)
        code, timed_out = reply.get("code"), reply.get("timed_out")
        if failed or not isinstance(code, int) or not isinstance(timed_out, bool):
            return failed or ToolResult(
                output, 1, f"bad reply from the sandbox: {reply!r:.200}", False, duration
            )
        if timed_out:
            error = f"command timed out after {timeout_s:g}s; every process it started was killed"
            return ToolResult(output, code, error, True, duration)
        if code == 127 and isinstance(reply.get("error"), str):
            error = f"cannot start {request['argv'][0]!r}: {reply['error']}"
            return ToolResult(output, 127, error, False, duration)
        return ToolResult(
            output, code, None if code == 0 else f"command exited with code {code}", False, duration
        )

    def _call(
        self, request: dict, timeout_s: float, body=None, sink=None, max_body: int = 0
    ) -> tuple[dict, bytes]:
        """One request and its reply under the lock; a channel failure breaks the sandbox."""
        with self._lock:
            boundary = self._boundary
            if boundary.closed:
                raise SandboxError(f"sandbox is closed (workspace {self.workspace})")
            if boundary.broken:
                raise SandboxError(f"sandbox is broken ({boundary.broken}); reset() starts a new one")
            try:
                return boundary.channel.call(request, time.monotonic() + timeout_s, body, sink, max_body)
            except ChannelError as exc:
                boundary.break_(str(exc))
                if exc.timed_out:
                    raise _NoAnswer(
                        f"the sandbox did not answer within {timeout_s:g}s; it was killed"
                    ) from None
                raise SandboxError(f"sandbox broken: {exc}") from None


class _NoAnswer(SandboxError):
    """The program inside did not answer in time."""


def _failed(reply: dict) -> ToolResult | None:
    """A reply's error as a result (exit_code 1), or a `SandboxError` when the request was refused."""
    error = reply.get("error")
    if error is None or reply.get("code") == 127:
        return None
    if reply.get("refused"):
        raise SandboxError(str(error))
    return ToolResult("", 1, str(error))


def _ms(start: float) -> float:
    return (time.monotonic() - start) * 1000.0

"""`DockerSandbox`: the agent tools in one long-lived container per sandbox (= per episode).

Every tool call is one exec into the container (`container_exec.run_exec`), an argv list, never a
formatted string: `sh -c WRAPPER agentstream-sandbox OP DIR ARGS...`. The wrapper (`WRAPPER`, run
as uid 65534 like everything else) checks paths inside the container, where the agent's symlinks
live (`realpath`, then the result must still be under /workspace), runs the operation, then SIGKILLs
every process in the container but PID 1 (docker-init), the keeper and itself, so nothing a command
started (setsid, nohup, double fork) outlives the call. The host then asks the engine for the
container's processes; if any is left (the agent killed its wrapper, or the keeper) the container
is restarted. A wall-clock deadline is kept on the host: past it the container is killed and
restarted, so killing `timeout` or the wrapper inside cannot outlive it.

Paths are also checked lexically on the host first. The host never opens a path of the workspace:
file_read, file_write, search, reset (a tar sent to `tar -x` inside) and snapshot (`tar -c` inside,
extracted here with the "data" filter) all go through exec. How the container is built and kept is
`container.py`; this module owns the tools and what they mean.
"""

from __future__ import annotations

import io
import logging
import posixpath
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from producers.sandbox.base import Sandbox, ToolResult, git_argv, shell_argv, truncate
from producers.sandbox.container import KEEPER_USER, Container, connect, engine_gaps
from producers.sandbox.container_exec import Combined, ExecOutcome, Split, run_exec
from producers.sandbox.container_programs import REFUSAL_PREFIX, REFUSALS, SEARCH_PY, WRAPPER
from producers.sandbox.errors import SandboxError
from producers.sandbox.image import SANDBOX_IMAGE
from producers.sandbox.workspace_tar import pack, unpack

__all__ = ["DockerConfig", "DockerSandbox"]

log = logging.getLogger(__name__)

WORKSPACE = "/workspace"
SIZE = re.compile(r"^[1-9][0-9]*[kmg]?$")
USER = re.compile(r"^([1-9][0-9]*):([1-9][0-9]*)$")
ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": WORKSPACE,
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
}


def _size(value: str) -> int:
    """Bytes of a size like "64m".

    >>> _size("64m"), _size("2k"), _size("10")
    (67108864, 2048, 10)
    """
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(value[-1], 1)
    return int(value.rstrip("kmg")) * scale


@dataclass(frozen=True)
class DockerConfig:
    """The container a `DockerSandbox` starts and the limits every tool call runs under."""

    image: str = field(
        default=SANDBOX_IMAGE,
        metadata={"help": "the sandbox image (agentstream sandbox-engine up builds it)"},
    )
    docker_host: str | None = field(
        default=None,
        metadata={"help": "the engine's address, e.g. unix:///path/docker.sock (default: DOCKER_HOST)"},
    )
    memory: str = field(default="512m", metadata={"help": "memory limit (no swap on top), e.g. 512m"})
    pids_limit: int = field(
        default=128, metadata={"help": "most processes and threads in the container at once"}
    )
    tmp_size: str = field(default="64m", metadata={"help": "size cap of /tmp (a tmpfs)"})
    workspace_size: str = field(default="256m", metadata={"help": "size cap of /workspace (a tmpfs volume)"})
    shm_size: str = field(default="16m", metadata={"help": "size cap of /dev/shm"})
    cpus: float = field(default=1.0, metadata={"help": "CPU share, in cores"})
    timeout_s: float = field(
        default=60, metadata={"help": "wall-clock limit of one tool call, kept by the host"}
    )
    output_bytes: int = field(
        default=1_000_000, metadata={"help": "output kept per call (cut with a marker)"}
    )
    user: str = field(default="65534:65534", metadata={"help": "uid:gid every command runs as (never 0)"})
    api_timeout_s: float = field(default=60, metadata={"help": "limit of one call to the engine's API"})

    def __post_init__(self) -> None:
        if not isinstance(self.image, str) or not self.image:
            raise SandboxError(f"DockerConfig.image must be a non-empty str, got {self.image!r}")
        if self.docker_host is not None and (not isinstance(self.docker_host, str) or not self.docker_host):
            raise SandboxError(
                f"DockerConfig.docker_host must be None or a non-empty str, got {self.docker_host!r}"
            )
        for name in ("memory", "tmp_size", "workspace_size", "shm_size"):
            value = getattr(self, name)
            if not isinstance(value, str) or not SIZE.match(value):
                raise SandboxError(
                    f"DockerConfig.{name} must be a size like '64m' (digits, then k, m or g), got {value!r}"
                )
        for name in ("pids_limit", "output_bytes", "cpus", "timeout_s", "api_timeout_s"):
            value = getattr(self, name)
            wrong = isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
            if wrong or (name in ("pids_limit", "output_bytes") and not isinstance(value, int)):
                raise SandboxError(f"DockerConfig.{name} must be a positive number, got {value!r}")
        if not isinstance(self.user, str) or not USER.match(self.user):
            raise SandboxError(f"DockerConfig.user must be 'uid:gid' with neither 0, got {self.user!r}")
        if self.user.split(":")[0] == KEEPER_USER.split(":")[0]:
            raise SandboxError(
                f"DockerConfig.user must not be the keeper's uid {KEEPER_USER!r} (commands could then "
                f"take over the container's init), got {self.user!r}"
            )

    @property
    def uid(self) -> int:
        return int(self.user.split(":")[0])

    @property
    def gid(self) -> int:
        return int(self.user.split(":")[1])


class DockerSandbox(Sandbox):
    """The agent tools in one container; `close()` removes it (see the module docstring)."""

    def __init__(self, config: DockerConfig = DockerConfig()):
        if not isinstance(config, DockerConfig):
            raise SandboxError(f"DockerSandbox takes a DockerConfig, got {type(config).__name__}")
        self.config = config
        self.workspace = Path(WORKSPACE)
        self._lock = threading.Lock()
        client = connect(config)
        try:
            missing = engine_gaps(client)
        except Exception:
            client.close()
            raise
        self._box: Container | None = Container(client, config)
        self.isolation: dict[str, Any] = {
            "backend": "docker",
            "filesystem": True,
            "network": True,
            "processes": True,
            "memory": True,
            "disk": True,
            "user": config.uid,
            "per_episode": True,
            "missing": missing,
            "container": self._box.name,
            "image": config.image,
        }
        self._fresh = True
        try:
            self.reset()
        except BaseException:
            self.close()
            raise

    # --- lifecycle -----------------------------------------------------------------------------

    def reset(self, snapshot_dir: Path | None = None) -> None:
        """A fresh workspace (empty, or a copy of the host directory `snapshot_dir`, modes and
        symlinks kept, owned by the sandbox user); /tmp emptied and every process gone (restart)."""
        self._open()
        self.submitted, self.answer = False, None
        archive = None
        if snapshot_dir is not None:
            archive = pack(Path(snapshot_dir), self.config.uid, _size(self.config.workspace_size))
        try:
            sink = Combined(self.config.output_bytes)
            has_tar = "0" if archive is None else "1"
            outcome, _note = self._call(
                "load", WORKSPACE, [has_tar], sink, stdin=archive, restart=not self._fresh
            )
            self._fresh = False
        finally:
            if archive is not None:
                archive.close()
        if outcome.timed_out or outcome.exit_code != 0:
            why = (
                "timed out"
                if outcome.timed_out
                else f"exit code {outcome.exit_code}: {truncate(sink.data, 2000)}"
            )
            raise SandboxError(f"reset: loading {snapshot_dir or 'an empty workspace'} failed ({why})")

    def snapshot(self, target: Path) -> Path:
        """Copy the workspace to the new host directory `target` (tar inside, extracted here with
        the "data" filter: members it refuses, such as links out of `target`, are skipped)."""
        self._open()
        target = Path(target)
        if target.exists():
            raise SandboxError(f"snapshot target {target} exists already")
        limit = 2 * _size(self.config.workspace_size) + (16 << 20)  # tar headers of many small files
        with tempfile.TemporaryFile() as spool:
            sink = Split(spool, limit)
            outcome, _note = self._call("dump", WORKSPACE, [], sink)
            if outcome.timed_out or outcome.exit_code != 0 or sink.overflow:
                why = "timed out" if outcome.timed_out else "too large" if sink.overflow else sink.stderr
                raise SandboxError(f"snapshot: reading the workspace failed ({why})")
            spool.seek(0)
            unpack(spool, target)
        return target

    def close(self) -> None:
        """Remove the container, its holder and the workspace volume; close the client."""
        if self._box is not None:
            box, self._box = self._box, None
            box.remove()

    def _open(self) -> Container:
        if self._box is None:
            raise SandboxError("the Docker sandbox is closed")
        return self._box

    # --- tools ---------------------------------------------------------------------------------

    def resolve(self, path: str) -> str:
        """`path` normalised against /workspace (lexically; the wrapper resolves symlinks inside)."""
        if not isinstance(path, str) or "\x00" in path:
            raise SandboxError(f"path must be a str without NUL, got {path!r}")
        full = posixpath.normpath(posixpath.join(WORKSPACE, path))
        if full != WORKSPACE and not full.startswith(WORKSPACE + "/"):
            raise SandboxError(f"path {path!r} is outside the workspace {WORKSPACE}")
        return full

    def file_read(self, path: str, start_line: int | None = None, end_line: int | None = None) -> ToolResult:
        """A file's text, or lines start_line..end_line (1-based, inclusive; end_line >= 1)."""
        for name, value in (("start_line", start_line), ("end_line", end_line)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise SandboxError(f"file_read {name} must be an int or None, got {value!r}")
        if end_line is not None and end_line < 1:
            raise SandboxError(f"file_read end_line must be >= 1, got {end_line}")
        lines = "all"
        if start_line is not None or end_line is not None:
            lines = f"{max(start_line or 1, 1)},{end_line if end_line is not None else '$'}p"
        limit = str(self.config.output_bytes + 1)
        return self._tool("read", [self.resolve(path), lines, limit], path)

    def file_write(self, path: str, content: str, create_dirs: bool = True) -> ToolResult:
        """Write `content` (UTF-8) through the wrapper's stdin; parents created when `create_dirs`."""
        if not isinstance(content, str):
            raise SandboxError(f"file_write content must be a str, got {type(content).__name__}")
        data = content.encode()
        if len(data) > _size(self.config.workspace_size):
            raise SandboxError(
                f"file_write content ({len(data)} bytes) exceeds workspace_size={self.config.workspace_size}"
            )
        result = self._tool(
            "write", [self.resolve(path), "1" if create_dirs else "0"], path, stdin=io.BytesIO(data)
        )
        if result.exit_code == 0:
            result.output = f"wrote {len(content)} characters to {path}"
        return result

    def shell(
        self, command: list[str] | str, timeout_s: float | None = None, work_dir: str | None = None
    ) -> ToolResult:
        """Run an argv, or a str as `/bin/sh -c <str>`; the timeout is capped at `config.timeout_s`."""
        if timeout_s is not None and (
            isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s < 0
        ):
            raise SandboxError(f"shell timeout_s must be a non-negative number, got {timeout_s!r}")
        timeout = min(timeout_s, self.config.timeout_s) if timeout_s else self.config.timeout_s
        cwd = self.resolve(work_dir) if work_dir is not None else WORKSPACE
        return self._tool("run", shell_argv(command), work_dir or ".", cwd=cwd, timeout_s=timeout)

    def search(self, pattern: str, path: str = ".", file_pattern: str | None = None) -> ToolResult:
        """`relpath:lineno:line` for each line matching the regex (Python `re`, inside the container)."""
        try:
            re.compile(pattern)
        except (re.error, TypeError) as exc:
            raise SandboxError(f"search pattern {pattern!r} is not a regular expression: {exc}") from exc
        if file_pattern is not None and not isinstance(file_pattern, str):
            raise SandboxError(f"search file_pattern must be a str or None, got {file_pattern!r}")
        return self._tool("search", [self.resolve(path), SEARCH_PY, pattern, file_pattern or ""], path)

    def git(self, subcommand: str, args: list[str] | None = None) -> ToolResult:
        """Run `git <subcommand> <args...>` in the workspace."""
        return self._tool("run", git_argv(subcommand, args), ".")

    # --- one call ------------------------------------------------------------------------------

    def _tool(
        self,
        op: str,
        args: list[str],
        subject: str,
        *,
        cwd: str = WORKSPACE,
        timeout_s: float | None = None,
        stdin: IO[bytes] | None = None,
    ) -> ToolResult:
        """Run one wrapper operation and turn what happened into a ToolResult (a refusal raises)."""
        start = time.monotonic()
        timeout = timeout_s or self.config.timeout_s
        sink = Combined(self.config.output_bytes)
        outcome, note = self._call(op, cwd, args, sink, stdin=stdin, timeout_s=timeout)
        code, output = outcome.exit_code, truncate(sink.data, self.config.output_bytes)
        duration = (time.monotonic() - start) * 1000.0
        if outcome.timed_out:
            error = f"command timed out after {timeout:g}s; the sandbox container was killed and restarted"
            error += RESTARTED
            return ToolResult(output, -9, error, True, duration)
        if code in REFUSALS and sink.stderr.startswith(REFUSAL_PREFIX) and not note:
            raise SandboxError(REFUSALS[code].format(path=subject))
        if code is None:
            error = "the engine did not report the command's exit code"
        elif note == OOM_NOTE:
            limit = self.config.memory
            error = f"command was killed by the kernel's OOM killer: the memory limit ({limit}) was reached"
        else:
            error = None if code == 0 else f"command exited with code {code}"
        if note and note != OOM_NOTE:
            error = f"{error}; {note}" if error else note
        return ToolResult(output, -1 if code is None else code, error, False, duration)

    def _call(
        self,
        op: str,
        cwd: str,
        args: list[str],
        sink: Combined | Split,
        *,
        stdin: IO[bytes] | None = None,
        timeout_s: float | None = None,
        restart: bool = False,
    ) -> tuple[ExecOutcome, str | None]:
        """One exec of the wrapper under the host deadline (after a restart of the container when
        `restart`), then the clean-up it calls for (`_settle`). Returns the outcome and a note for
        the agent (None when nothing unusual happened)."""
        box = self._open()
        argv = ["/bin/sh", "-c", WRAPPER, "agentstream-sandbox", op, cwd, *args]
        with self._lock:
            try:
                if restart:
                    box.restart()
                since = time.time()
                deadline = time.monotonic() + (timeout_s or self.config.timeout_s)
                user = self.config.user
                outcome = run_exec(
                    box.api, box.name, argv, user=user, env=ENV, stdin=stdin, sink=sink, deadline=deadline
                )
                return outcome, _settle(box, outcome, since, op)
            except SandboxError:
                raise
            except Exception as exc:  # the engine failed under us: the agent sees why, the episode goes on
                raise SandboxError(
                    f"the Docker engine failed during {op}: {type(exc).__name__}: {exc}"
                ) from exc


def _settle(box: Container, outcome: ExecOutcome, since: float, op: str) -> str | None:
    """After one exec: restart on a timeout or when processes were left behind; look up an OOM
    kill when the exit code says SIGKILL. The note for the agent, or None."""
    if outcome.timed_out:
        box.restart()
        return None
    note = None
    if outcome.exit_code in (137, None) and box.oom_killed_since(since):
        note = OOM_NOTE
    leftovers = box.leftovers()
    if leftovers:
        log.info("sandbox %s: %d process(es) outlived %s; restarting", box.name, len(leftovers), op)
        box.restart()
        note = note or f"processes the command left running were ended{RESTARTED}"
    return note


OOM_NOTE = "oom"
RESTARTED = " (the workspace is kept; /tmp was emptied)"

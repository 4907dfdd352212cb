"""`DockerSandbox`: the same tools in a container (docker SDK), and `make_sandbox` to pick a backend.

The container runs `sleep infinity` with no network, a memory and CPU cap and the label
`agentstream.sandbox=1`; commands are `exec_run` argv lists (never formatted strings), files move
through tar archives, `snapshot` also commits the container to an image. `docker` is imported
lazily so the local backend never needs it. Paths are checked lexically against /workspace (the
container's symlinks cannot be resolved from here; the container is the boundary).
"""

from __future__ import annotations

import io
import logging
import posixpath
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producers.sandbox.base import Sandbox, ToolResult, git_argv, shell_argv, truncate
from producers.sandbox.errors import SandboxError

__all__ = ["DockerConfig", "DockerSandbox", "docker_unavailable_reason", "make_sandbox"]

log = logging.getLogger(__name__)

LABEL = {"agentstream.sandbox": "1"}
WORKSPACE = "/workspace"
# The search tool's program inside the container: pattern, path and glob arrive as argv.
SEARCH_PY = """import fnmatch, os, re, sys
rx, root, glob = re.compile(sys.argv[1]), sys.argv[2], sys.argv[3]
for d, dirs, files in os.walk(root):
    dirs[:] = sorted(x for x in dirs if x != ".git")
    for name in sorted(files):
        if glob and not fnmatch.fnmatch(name, glob):
            continue
        p = os.path.join(d, name)
        try:
            for i, line in enumerate(open(p, encoding="utf-8", errors="replace"), 1):
                if rx.search(line):
                    print(f"{os.path.relpath(p, '/workspace')}:{i}:{line.rstrip()}")
        except OSError:
            pass
"""


@dataclass(frozen=True)
class DockerConfig:
    """The container a `DockerSandbox` starts."""

    image: str = "python:3.11-slim"
    mem_limit: str = "512m"
    nano_cpus: int = 1_000_000_000
    timeout_s: float = 60
    output_bytes: int = 1_000_000


def docker_unavailable_reason(ping_timeout_s: float = 2.0) -> str | None:
    """None when a Docker engine answers a ping within the timeout, else why not."""
    try:
        import docker
    except ImportError:
        return "the `docker` package is not installed (pip install 'agentstream[dev]')"
    try:
        docker.from_env(timeout=ping_timeout_s).ping()
    except Exception as exc:  # the SDK raises many kinds for "no engine": report, do not crash
        return f"no Docker engine reachable: {type(exc).__name__}: {exc}"
    return None


class DockerSandbox(Sandbox):
    """The agent tools in a throwaway container; `close()` removes it."""

    def __init__(self, config: DockerConfig = DockerConfig()):
        import docker

        self.config = config
        self.workspace = Path(WORKSPACE)
        self._client = docker.from_env()
        self._container: Any = None
        self.reset()

    def reset(self, snapshot_dir: Path | None = None) -> None:
        """A fresh container with an empty /workspace, or a copy of `snapshot_dir`."""
        self._remove()
        self.submitted, self.answer = False, None
        self._container = self._client.containers.run(
            self.config.image,
            ["sleep", "infinity"],
            detach=True,
            network_disabled=True,
            mem_limit=self.config.mem_limit,
            nano_cpus=self.config.nano_cpus,
            labels=LABEL,
            working_dir=WORKSPACE,
        )
        self._exec(["mkdir", "-p", WORKSPACE], 30)
        if snapshot_dir is not None:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(snapshot_dir, arcname=".")
            self._container.put_archive(WORKSPACE, buf.getvalue())

    def snapshot(self, target: Path) -> Path:
        """Extract /workspace to `target`; the container is also committed to an image."""
        self._container.commit(repository="agentstream-sandbox", tag=self._container.short_id)
        stream, _ = self._container.get_archive(WORKSPACE + "/.")
        data = io.BytesIO(b"".join(stream))
        Path(target).mkdir(parents=True)
        with tarfile.open(fileobj=data) as tar:
            tar.extractall(target, filter="data")
        return Path(target)

    def close(self) -> None:
        self._remove()
        self._client.close()

    def _remove(self) -> None:
        if self._container is not None:
            self._container.remove(force=True)
            self._container = None

    def resolve(self, path: str) -> str:
        """`path` normalised against /workspace; refused if it leaves it."""
        if not isinstance(path, str) or "\x00" in path:
            raise SandboxError(f"path must be a str without NUL, got {path!r}")
        full = posixpath.normpath(posixpath.join(WORKSPACE, path))
        if full != WORKSPACE and not full.startswith(WORKSPACE + "/"):
            raise SandboxError(f"path {path!r} is outside the workspace {WORKSPACE}")
        return full

    def file_read(self, path: str, start_line: int | None = None, end_line: int | None = None) -> ToolResult:
        """A file's text, or lines start_line..end_line (1-based, inclusive)."""
        result = self._exec(["cat", "--", self.resolve(path)], self.config.timeout_s)
        if result.exit_code == 0 and (start_line is not None or end_line is not None):
            lines = result.output.splitlines(keepends=True)
            result.output = "".join(lines[max((start_line or 1) - 1, 0) : end_line])
        return result

    def file_write(self, path: str, content: str, create_dirs: bool = True) -> ToolResult:
        """Write `content` through a tar archive (parents created when `create_dirs`)."""
        full = self.resolve(path)
        parent, name = posixpath.split(full)
        if create_dirs:
            self._exec(["mkdir", "-p", "--", parent], self.config.timeout_s)
        data = content.encode()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), int(time.time())
            tar.addfile(info, io.BytesIO(data))
        if not self._container.put_archive(parent, buf.getvalue()):
            return ToolResult("", 1, f"file_write: cannot write {path!r}")
        return ToolResult(f"wrote {len(content)} characters to {path}", 0)

    def shell(
        self, command: list[str] | str, timeout_s: float | None = None, work_dir: str | None = None
    ) -> ToolResult:
        """Run an argv, or a str as `/bin/sh -c <str>`, under `timeout <s>` in the container."""
        cwd = self.resolve(work_dir) if work_dir is not None else WORKSPACE
        timeout = min(timeout_s, self.config.timeout_s) if timeout_s else self.config.timeout_s
        return self._exec(shell_argv(command), timeout, cwd)

    def search(self, pattern: str, path: str = ".", file_pattern: str | None = None) -> ToolResult:
        """Regex search with Python's `re` inside the container; arguments travel as argv."""
        argv = ["python3", "-c", SEARCH_PY, pattern, self.resolve(path), file_pattern or ""]
        return self._exec(argv, self.config.timeout_s)

    def git(self, subcommand: str, args: list[str] | None = None) -> ToolResult:
        return self._exec(git_argv(subcommand, args), self.config.timeout_s)

    def _exec(self, argv: list[str], timeout_s: float, cwd: str = WORKSPACE) -> ToolResult:
        """exec_run under coreutils `timeout -s KILL` (exit 137 means it was killed at the limit)."""
        start = time.monotonic()
        full = ["timeout", "-s", "KILL", f"{timeout_s:g}", *argv]
        code, out = self._container.exec_run(full, workdir=cwd, demux=False)
        timed_out = code == 137
        error = None if code == 0 else f"command {argv[0]!r} exited with code {code}"
        output = truncate(out or b"", self.config.output_bytes)
        return ToolResult(output, code, error, timed_out, (time.monotonic() - start) * 1000.0)


def make_sandbox(backend: str = "auto", **kwargs: Any) -> Sandbox:
    """A `DockerSandbox` when asked for (or "auto") and an engine answers in 2 s, else local.

    `backend="docker"` without an engine raises `SandboxError` with the reason.
    """
    if backend not in ("auto", "local", "docker"):
        raise SandboxError(f"sandbox backend must be 'auto', 'local' or 'docker', got {backend!r}")
    if backend != "local":
        reason = docker_unavailable_reason()
        if reason is None:
            return DockerSandbox(**kwargs)
        if backend == "docker":
            raise SandboxError(f"sandbox backend 'docker' unavailable: {reason}")
        log.info("sandbox backend auto: using local (%s)", reason)
    from producers.sandbox.local import LocalSandbox

    return LocalSandbox(**kwargs)

"""One local sandbox's boundary on the host: the process that holds it (bwrap running `inside.py`
as PID 1, or, unisolated, `inside.py` alone in a private host dir), its channel, and what confines
it (a leased uid and a cgroup when root, see `confinement`); started, greeted, killed, and the
honest report of what it isolates (`isolation`).

It must not run agent commands itself (they run inside, through the channel) nor resolve agent
paths on the host; `local` owns the tools.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producers.sandbox import confinement, inside
from producers.sandbox.bubblewrap import WORKSPACE, NamespacePlan, etc_files, namespace_argv
from producers.sandbox.channel import Channel, ChannelError
from producers.sandbox.errors import SandboxError

__all__ = ["Boundary", "BoundarySpec", "start_boundary"]

log = logging.getLogger(__name__)

START_TIMEOUT_S = 20.0
INSIDE_SOURCE = Path(inside.__file__).read_text(encoding="utf-8")
INSIDE = ["-I", "-S", "-c", INSIDE_SOURCE]  # after the python: isolated mode, no site, the program
UNISOLATED_HINT = (
    "or pass unisolated=True (sandbox env: --env-args '{\"unisolated\": true}') to run agent commands "
    "with NO filesystem isolation"
)


@dataclass(frozen=True)
class BoundarySpec:
    """What the boundary is sized to: its writable mounts, network, and the episode's cgroup."""

    workspace_bytes: int
    tmp_bytes: int
    shm_bytes: int
    network: bool
    pids_max: int
    memory_bytes: int
    memory_mb: float  # the per-process limit, named in the report when there is no cgroup


@dataclass
class Boundary:
    """The running program (bwrap, or inside.py itself when unisolated) and what confines it."""

    proc: subprocess.Popen
    channel: Channel
    workspace: str
    isolation: dict[str, Any]
    lease: confinement.UidLease | None = None
    cgroup: confinement.Cgroup | None = None
    base: Path | None = None
    errors: Any = None
    broken: str | None = None
    closed: bool = False

    def break_(self, reason: str) -> None:
        """Kill the namespace now: the program stopped answering or answered garbage."""
        self.broken = reason
        self._kill()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.channel.close()  # inside.py reads end of file, kills everything, exits: the namespace ends
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            self._kill()
        left = self.cgroup.remove() if self.cgroup is not None else []
        if self.lease is not None:
            confinement.kill_uid(self.lease.uid)
            self.lease.release(keep=bool(left))  # its record lets a later sweep retry
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
        if self.errors is not None:
            self.errors.close()

    def _kill(self) -> None:
        """SIGKILL the program's process tree (PID 1 of a namespace takes the namespace with it)."""
        for pid in [*inside.descendants(self.proc.pid), self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
        if self.lease is not None:
            confinement.kill_uid(self.lease.uid)
        self.proc.wait()


def start_boundary(spec: BoundarySpec, unisolated: bool, bwrap: str) -> Boundary:
    """The isolated boundary; without bubblewrap, the unisolated one if allowed, else SandboxError."""
    path = shutil.which(bwrap)
    if path is None:
        reason = f"bubblewrap is not installed ({bwrap!r} not found): apt-get install bubblewrap"
    else:
        try:
            return _launch(spec, path)
        except _NoNamespace as exc:
            reason = f"bubblewrap cannot create its namespaces here: {exc}"
    if not unisolated:
        raise SandboxError(f"{reason}, {UNISOLATED_HINT}")
    return _launch(spec, None, reason)


class _NoNamespace(SandboxError):
    """bwrap started but its program never answered (no user namespaces, a seccomp policy...)."""


def _launch(spec: BoundarySpec, bwrap: str | None, unisolated_reason: str | None = None) -> Boundary:
    """Start the program (in bwrap when `bwrap` is a path, on the host otherwise) and greet it."""
    lease = confinement.lease_uid() if os.geteuid() == 0 else None
    cgroup, cgroup_reason = (None, "the host process is not root: no per-sandbox cgroup")
    if lease is not None:
        cgroup, cgroup_reason = confinement.make_cgroup(lease, spec.pids_max, spec.memory_bytes)
    data_fds: list[int] = []
    base = None
    errors = tempfile.TemporaryFile()  # noqa: SIM115 - the boundary owns it until close()
    try:
        if bwrap is not None:
            argv, data_fds = _namespace(spec, bwrap)
        else:
            base = _private_dir(lease)
            argv = [_system_python(), *INSIDE, str(base / "workspace"), "host", str(base / "tmp")]
        proc = _spawn(cgroup.enter_argv(argv) if cgroup else argv, lease, data_fds, errors)
    except BaseException:
        _undo(lease, cgroup, base)
        errors.close()
        raise
    finally:
        for fd in data_fds:
            os.close(fd)
    boundary = Boundary(proc, Channel(proc), "", {}, lease, cgroup, base, errors)
    inside_uid = _greet(boundary, isolated=bwrap is not None)
    boundary.isolation = _isolation(
        spec, bwrap is not None, lease, cgroup_reason, inside_uid, unisolated_reason
    )
    return boundary


def _namespace(spec: BoundarySpec, bwrap: str) -> tuple[list[str], list[int]]:
    """The bwrap argv with `inside.py` as PID 1, and the fds of the /etc files it reads."""
    etc_fds = {name: _data_fd(data) for name, data in etc_files().items()}
    program = [_system_python(), *INSIDE, WORKSPACE, "pid1", "/tmp", "/dev/shm"]
    sizes = (spec.workspace_bytes, spec.tmp_bytes, spec.shm_bytes)
    plan = NamespacePlan(bwrap, program, *sizes, network=spec.network, etc_fds=etc_fds)
    return namespace_argv(plan), list(etc_fds.values())


def _greet(boundary: Boundary, isolated: bool) -> int:
    """The program's hello: where its workspace is and the uid it runs as. No answer in time
    means no namespace (or no program): the boundary is torn down and the reason raised."""
    try:
        hello, _ = boundary.channel.call({"op": "hello"}, time.monotonic() + START_TIMEOUT_S)
        boundary.workspace = str(hello["workspace"])
        return int(hello["uid"])
    except (ChannelError, KeyError, TypeError, ValueError) as exc:
        boundary.break_(str(exc))
        detail = _stderr_of(boundary.errors) or str(exc)
        boundary.close()
        if not isolated:
            raise SandboxError(f"the unisolated sandbox program did not start: {detail}") from None
        raise _NoNamespace(detail) from None


def _spawn(
    argv: list[str], lease: confinement.UidLease | None, pass_fds: list[int], errors
) -> subprocess.Popen:
    """The program as the leased uid (root) or this user, in a session of its own, with a minimal
    environment; its stderr goes to `errors`, read only when it fails to start."""
    uid = lease.uid if lease is not None else None
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errors,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        user=uid,
        group=uid,
        extra_groups=[] if uid is not None else None,
        pass_fds=pass_fds,
        start_new_session=True,
    )


def _data_fd(data: bytes) -> int:
    """The read end of a pipe holding `data` (a small file bwrap's --ro-bind-data reads)."""
    read_end, write_end = os.pipe()
    os.write(write_end, data)
    os.close(write_end)
    return read_end


def _private_dir(lease: confinement.UidLease | None) -> Path:
    """The unisolated workspace and temp dir: a fresh 0700 host dir owned by the sandbox's uid."""
    base = Path(tempfile.mkdtemp(prefix="agentstream-sandbox-"))
    for path in (base, base / "workspace", base / "tmp"):
        path.mkdir(mode=0o700, exist_ok=True)
        if lease is not None:
            os.chown(path, lease.uid, lease.uid)
    return base


def _undo(lease: confinement.UidLease | None, cgroup: confinement.Cgroup | None, base: Path | None) -> None:
    left = cgroup.remove() if cgroup is not None else []
    if lease is not None:
        lease.release(keep=bool(left))
    if base is not None:
        shutil.rmtree(base, ignore_errors=True)


def _stderr_of(errors) -> str:
    errors.seek(0)
    return errors.read(4000).decode("utf-8", errors="replace").strip()


def _system_python() -> str:
    """A python3 under /usr (the only host dir the namespace sees) to run `inside.py` with."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK) and os.path.realpath(candidate).startswith("/usr/"):
            return candidate
    raise SandboxError(
        "no python3 under /usr to run the sandbox's init program: apt-get install python3-minimal"
    )


def _isolation(
    spec: BoundarySpec,
    isolated: bool,
    lease: confinement.UidLease | None,
    cgroup_reason: str | None,
    inside_uid: int,
    unisolated_reason: str | None,
) -> dict[str, Any]:
    """What this sandbox enforces (the contract's keys, plus cpu/file_size and the host uid)."""
    host_uid = lease.uid if lease is not None else os.getuid()
    missing = []
    if not isolated:
        missing += [
            f"filesystem: {unisolated_reason}; commands see the host's files as uid {host_uid}",
            "network: no network namespace",
            "disk: no size cap on the workspace; /tmp is the host's (TMPDIR points to a private dir)",
        ]
        if lease is None:
            missing.append(f"processes: RLIMIT_NPROC counts every process of uid {host_uid} on the host")
    elif spec.network:
        missing.append("network: allowed (Limits.network=True)")
    if cgroup_reason is not None:
        missing.append(
            f"memory: RLIMIT_AS of {spec.memory_mb} MB per process only, not per episode ({cgroup_reason})"
        )
    info = {
        "backend": "local",
        "filesystem": isolated,
        "network": isolated and not spec.network,
        "processes": isolated or lease is not None,
        "memory": cgroup_reason is None,
        "disk": isolated,
        "user": inside_uid,
        "per_episode": True,
        "missing": missing,
        "host_uid": host_uid,
        "cpu": True,
        "file_size": True,
        "namespaces": isolated,
    }
    if not isolated:
        log.warning("local sandbox is NOT isolated: %s", "; ".join(missing))
    elif missing:
        log.info("local sandbox: not enforced here: %s", "; ".join(missing))
    return info

"""What bounds one local sandbox on the host when the host process runs as root: a dedicated
unprivileged uid and a cgroup (v1 `pids` + `memory`) for the whole episode.

Why a uid of its own: the kernel never enforces RLIMIT_NPROC for host uid 0, and bubblewrap run as
root maps the sandbox user to host root. Each live sandbox therefore runs as its own uid, leased
from a high range with a lock file (`/run/agentstream-sandbox/<uid>.lock`, held while the sandbox
lives and dropped by the kernel if the process dies), so no two sandboxes, here or in another
process, share a uid: one episode cannot signal, trace or count against another.

Why a cgroup: rlimits bind each process alone; N processes each under RLIMIT_AS add up. A cgroup
with `pids.max` and `memory.limit_in_bytes` bounds the episode as a whole (its tmpfs pages too).
It is created under the host process's own cgroup and removed at close. Only cgroup v1 hierarchies
are used (v2 needs delegation this module does not do); without them `cgroup_unavailable` says why.

It must not touch processes or cgroups that are not its sandbox's own.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from producers.sandbox.errors import SandboxError

log = logging.getLogger(__name__)

__all__ = ["Cgroup", "UidLease", "lease_uid", "make_cgroup", "processes_of_uid", "sweep_stale"]

UID_BASE = 1_900_000_000  # far above any login or container subuid range; below 2**31
UID_SPAN = 200_000_000
LEASE_DIR = Path("/run/agentstream-sandbox")
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PREFIX = "agentstream-sandbox-"  # + the leased uid: one cgroup per sandbox and controller
CONTROLLERS = ("pids", "memory")


@dataclass
class UidLease:
    """A uid held for one sandbox: `release()` frees it for the next."""

    uid: int
    fd: int
    path: Path

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(self.fd)
            self.fd = -1


def lease_uid(lease_dir: Path = LEASE_DIR) -> UidLease:
    """A uid no live process has and no other sandbox holds (a random pick, locked with flock);
    what sandboxes of a killed host process left behind is swept first (`sweep_stale`)."""
    lease_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    sweep_stale(lease_dir)
    for _ in range(64):
        uid = UID_BASE + secrets.randbelow(UID_SPAN)
        path = lease_dir / f"{uid}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if not processes_of_uid(uid):
            return UidLease(uid, fd, path)
        os.close(fd)
    raise SandboxError(f"no free sandbox uid in [{UID_BASE}, {UID_BASE + UID_SPAN}) after 64 tries")


def sweep_stale(lease_dir: Path = LEASE_DIR) -> list[int]:
    """Remove what the sandboxes of a host process killed with SIGKILL left: for every lease file no
    live sandbox holds (its flock is free), the uid's processes, its cgroups and the file. Returns
    the uids swept. A live sandbox holds its lock from lease to close, so it is never touched."""
    swept = []
    for path in sorted(lease_dir.glob("*.lock")):
        if not path.stem.isdigit() or not UID_BASE <= int(path.stem) < UID_BASE + UID_SPAN:
            continue
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue  # removed meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # a live sandbox
        try:
            uid = int(path.stem)
            kill_uid(uid)
            Cgroup(_cgroup_dirs(f"{CGROUP_PREFIX}{uid}")).remove()
            with contextlib.suppress(OSError):
                path.unlink()
            swept.append(uid)
        finally:
            os.close(fd)
    if swept:
        log.info("sandbox: swept what %d killed sandbox(es) left behind (uids %s)", len(swept), swept)
    return swept


def _cgroup_dirs(name: str) -> list[Path]:
    """The existing directories of cgroup `name` under this process's own v1 cgroups."""
    found = []
    for controller in CONTROLLERS:
        parent = _own_cgroup(controller)
        if parent is not None and (parent / name).is_dir():
            found.append(parent / name)
    return found


def processes_of_uid(uid: int) -> list[int]:
    """Pids (zombies too) whose /proc entry is owned by `uid`."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def kill_uid(uid: int, rounds: int = 100) -> bool:
    """SIGKILL every process of `uid` until none is left; False if some survived `rounds` sweeps."""
    for _ in range(rounds):
        pids = processes_of_uid(uid)
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    return not processes_of_uid(uid)


@dataclass
class Cgroup:
    """One sandbox's cgroup directories (one per v1 controller)."""

    dirs: list[Path]

    def enter_argv(self, argv: list[str]) -> list[str]:
        """`argv` behind a /bin/sh trampoline that first moves itself into the cgroup, then execs:
        everything the sandbox starts is born inside it."""
        script = (
            'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ >"$1" || exit 126; shift; n=$((n-1)); done; '
            'exec "$@"'
        )
        procs = [str(d / "cgroup.procs") for d in self.dirs]
        return ["/bin/sh", "-c", script, "sh", str(len(procs)), *procs, *argv]

    def remove(self) -> None:
        """Kill what is left in it, then remove the directories (a process takes a moment to leave)."""
        for directory in self.dirs:
            for _ in range(200):
                try:
                    pids = (directory / "cgroup.procs").read_text().split()
                except OSError:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
                try:
                    directory.rmdir()
                    break
                except OSError:
                    time.sleep(0.005)


def make_cgroup(name: str, uid: int, pids_max: int, memory_bytes: int) -> tuple[Cgroup | None, str | None]:
    """A pids + memory cgroup for one sandbox, its `cgroup.procs` owned by `uid` (so the trampoline,
    already running as `uid`, can enter it); or None and why not."""
    if os.geteuid() != 0:
        return None, "a cgroup needs root (the host process is not root)"
    made: list[Path] = []
    try:
        for controller, settings in (
            ("pids", {"pids.max": pids_max}),
            ("memory", {"memory.limit_in_bytes": memory_bytes, "memory.memsw.limit_in_bytes": memory_bytes}),
        ):
            parent = _own_cgroup(controller)
            if parent is None:
                raise OSError(f"no cgroup v1 {controller} hierarchy at {CGROUP_ROOT / controller}")
            directory = parent / name
            directory.mkdir()
            made.append(directory)
            for file, value in settings.items():
                if (directory / file).exists() or not file.startswith("memory.memsw"):
                    (directory / file).write_text(str(value))
            os.chown(directory / "cgroup.procs", uid, -1)
    except OSError as exc:
        Cgroup(made).remove()
        return None, f"no per-sandbox cgroup: {exc}"
    return Cgroup(made), None


def _own_cgroup(controller: str) -> Path | None:
    """This process's cgroup directory in the v1 hierarchy of `controller`, if there is one."""
    mount = CGROUP_ROOT / controller
    if not (mount / "cgroup.procs").exists():
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            directory = mount / path.lstrip("/")
            return directory if directory.is_dir() else mount
    return mount

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

A host process killed with SIGKILL cannot remove them, and the process that sweeps up after it may
sit in another cgroup (each job on a host can have its own memory cgroup). So the lease file records
each cgroup directory before it is made, and the sweep removes exactly what is recorded, each path
checked first (the file is ours, but it lives in /run: it is read as untrusted input).

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

__all__ = [
    "Cgroup",
    "UidLease",
    "lease_uid",
    "make_cgroup",
    "processes_of_uid",
    "recorded_cgroups",
    "sweep_stale",
]

UID_BASE = 1_900_000_000  # far above any login or container subuid range; below 2**31
UID_SPAN = 200_000_000
LEASE_DIR = Path("/run/agentstream-sandbox")
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PREFIX = "agentstream-sandbox-"  # + the leased uid: one cgroup per sandbox and controller
CONTROLLERS = ("pids", "memory")
MAX_RECORD = 16_384  # bytes of a lease file read by the sweep: a record is a line per controller


@dataclass
class UidLease:
    """A uid held for one sandbox: `release()` frees it for the next."""

    uid: int
    fd: int
    path: Path

    def record(self, directory: Path) -> None:
        """Note in the lease file a cgroup directory this sandbox makes (before it is made), so a
        sweep after a SIGKILL finds it wherever it is."""
        os.write(self.fd, f"{directory}\n".encode())

    def release(self, keep: bool = False) -> None:
        """Free the uid; `keep` leaves the file (and what it records) for a later sweep to finish."""
        if self.fd >= 0:
            if not keep:
                with contextlib.suppress(OSError):
                    self.path.unlink()
            os.close(self.fd)
            self.fd = -1


def lease_uid(lease_dir: Path | None = None) -> UidLease:
    """A uid no live process has and no other sandbox holds (a random pick, locked with flock in
    `lease_dir`, by default `LEASE_DIR`); what sandboxes of a killed host process left behind is
    swept first (`sweep_stale`)."""
    lease_dir = LEASE_DIR if lease_dir is None else lease_dir
    lease_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    sweep_stale(lease_dir)
    for _ in range(64):
        uid = UID_BASE + secrets.randbelow(UID_SPAN)
        path = lease_dir / f"{uid}.lock"
        fd = _lock(path, os.O_CREAT)
        if fd is None:
            continue
        if os.fstat(fd).st_size == 0 and not processes_of_uid(uid):
            return UidLease(uid, fd, path)
        os.close(fd)  # a killed sandbox's, not swept yet: the next sweep takes it
    raise SandboxError(f"no free sandbox uid in [{UID_BASE}, {UID_BASE + UID_SPAN}) after 64 tries")


def _lock(path: Path, create: int = 0) -> int | None:
    """`path` opened and flocked, or None when a live sandbox holds it, it is gone, or it was swept
    and replaced between the open and the lock (the lock would then guard an unlinked file)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | create, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def sweep_stale(lease_dir: Path | None = None) -> list[int]:
    """Remove what the sandboxes of a host process killed with SIGKILL left: for every lease file no
    live sandbox holds (its flock is free), the uid's processes, the cgroups it records and the file.
    Returns the uids swept. A live sandbox holds its lock from lease to close, so it is never
    touched. A file whose cgroups could not all be removed stays, for the next sweep to retry."""
    lease_dir = LEASE_DIR if lease_dir is None else lease_dir
    swept = []
    for path in sorted(lease_dir.glob("*.lock")):
        if not path.stem.isdigit() or not UID_BASE <= int(path.stem) < UID_BASE + UID_SPAN:
            continue
        fd = _lock(path)
        if fd is None:
            continue
        try:
            uid = int(path.stem)
            kill_uid(uid)
            if not Cgroup(recorded_cgroups(os.pread(fd, MAX_RECORD, 0), uid)).remove():
                with contextlib.suppress(OSError):
                    path.unlink()
                swept.append(uid)
        finally:
            os.close(fd)
    if swept:
        log.info("sandbox: swept what %d killed sandbox(es) left behind (uids %s)", len(swept), swept)
    return swept


def recorded_cgroups(record: bytes, uid: int) -> list[Path]:
    """The cgroup directories a lease file of `uid` records that may be removed: each must resolve
    to itself (no link, no `..`), lie below `/sys/fs/cgroup/<controller>/` of a controller used
    here, and be named `CGROUP_PREFIX + uid`. Anything else is refused, with a warning."""
    found: list[Path] = []
    for raw in record.split(b"\n"):
        if not raw:
            continue
        directory = _checked_cgroup_dir(raw, f"{CGROUP_PREFIX}{uid}")
        if directory is None:
            log.warning(
                "sandbox: lease of uid %d records %r, not a cgroup of that sandbox: left alone",
                uid,
                raw[:300],
            )
        elif directory not in found:
            found.append(directory)
    return found


def _checked_cgroup_dir(raw: bytes, name: str) -> Path | None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\0" in text or not text.startswith("/"):
        return None
    directory = Path(os.path.realpath(text))
    if str(directory) != text or directory.name != name:
        return None
    for controller in CONTROLLERS:
        if Path(os.path.realpath(CGROUP_ROOT / controller)) in directory.parents:
            return directory
    return None


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

    def remove(self) -> list[Path]:
        """Kill what is left in each directory, then remove it (a process takes a moment to leave).
        Returns the directories it gave up on, each named in a warning."""
        return [directory for directory in self.dirs if not _remove_cgroup_dir(directory)]


def _remove_cgroup_dir(directory: Path, tries: int = 200) -> bool:
    pids: list[str] = []
    error: OSError | None = None
    for _ in range(tries):
        try:
            directory.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            error = exc
        try:
            pids = (directory / "cgroup.procs").read_text().split()
        except FileNotFoundError:
            return True
        except OSError:
            pids = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.005)
    log.warning(
        "sandbox: gave up removing cgroup %s after %d tries (%s; processes still in it: %s)",
        directory,
        tries,
        error,
        " ".join(pids) or "none",
    )
    return False


def make_cgroup(lease: UidLease, pids_max: int, memory_bytes: int) -> tuple[Cgroup | None, str | None]:
    """A pids + memory cgroup for the sandbox of `lease`, named `CGROUP_PREFIX + uid`, its
    `cgroup.procs` owned by the uid (so the trampoline, already running as it, can enter it) and
    each directory recorded in the lease file before it is made; or None and why not."""
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
            directory = Path(os.path.realpath(parent)) / f"{CGROUP_PREFIX}{lease.uid}"
            lease.record(directory)
            directory.mkdir()
            made.append(directory)
            for file, value in settings.items():
                if (directory / file).exists() or not file.startswith("memory.memsw"):
                    (directory / file).write_text(str(value))
            os.chown(directory / "cgroup.procs", lease.uid, -1)
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

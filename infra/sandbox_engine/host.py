"""What the private engine touches on the host, read and undone by hand: its processes (stopped by
PID, checked by start time, never by name), the mounts it leaves under its state directory, the
`fcntl` locks that keep two sessions from running two engines on one data root, its log's tail.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import time
from pathlib import Path

from infra.sandbox_engine.errors import SandboxEngineError

__all__ = [
    "FileLock",
    "descendants",
    "log_tail",
    "mounts_under",
    "pid_alive",
    "same_process",
    "stop_pid",
    "unmount",
]

LOG_TAIL_LINES = 20
LOCK_TIMEOUT_S = 900.0  # a waiting session may sit behind a whole image build
MNT_DETACH = 2


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:]) or f"({path} is empty)"


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root` (from /proc/self/mounts), deepest first."""
    prefix = str(root.resolve()) if root.exists() else str(root)
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split(" ")
        if len(fields) < 2:
            continue
        point = _unescape(fields[1])
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def _unescape(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def unmount(point: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(point.encode(), MNT_DETACH) != 0:
        errno = ctypes.get_errno()
        raise SandboxEngineError(f"cannot unmount {point!r}: {os.strerror(errno)}")


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone: it has exited, only its parent has not reaped it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def stop_pid(pid: int, grace_s: float) -> None:
    """SIGTERM `pid`, SIGKILL when it has not exited after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.05)
    raise SandboxEngineError(f"dockerd (pid {pid}) did not exit after SIGKILL")


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of every process below `pid`, so a survivor is killed only if it is the same."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        starts[int(entry.name)] = fields[19]
    out, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append((child, starts[child]))
        todo.extend(children.get(child, []))
    return out


def same_process(pid: int, start: str) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return False
    return fields[19] == start and fields[0] != "Z"


class FileLock:
    """An `fcntl.flock` on a file of the state directory."""

    EX = fcntl.LOCK_EX
    SH = fcntl.LOCK_SH

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def acquire(self, mode: int, timeout_s: float | None = LOCK_TIMEOUT_S) -> bool:
        """Take the lock; False when `timeout_s` passed first (0: do not wait)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                self._fd = fd
                return True
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.2)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None

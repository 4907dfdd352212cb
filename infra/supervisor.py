"""The one process supervisor of the top floor: `agentstream up` (the whole stack) and
`agentstream worker --roles a,b` (one process per role) both run their processes through it.

Owns process lifecycle only: spawning `agentstream <args>` children, restarting one that exits
(with backoff), stopping them all in reverse start order (SIGTERM, then SIGKILL after a grace
period: faust can ignore SIGTERM), and stopping on SIGTERM / SIGINT. It knows nothing about events.

Restart policy, per component:
- `always`: any exit restarts it (the stack: a crashed broker, sink or worker comes back);
- `replay`: only `EXIT_REPLAY` restarts it (a stream role asking to be consumed again from its
  committed offsets); any other exit is final, and `run` then stops the others and returns 1.
Consecutive quick exits wait `RESTART_BACKOFF_S[n]`; one that ran `STEADY_AFTER_S` starts over.

No orphans: each child runs in its own session, so a stop signals its whole process group
(grandchildren included). If the supervisor itself dies (`kill -9`), two things take the tree down:
- on Linux each child asks the kernel for SIGKILL when its parent dies (`PR_SET_PDEATHSIG`); the
  kernel ties that to the *thread* that spawned it, so it is only asked from the main thread;
- a guardian process (a few lines of Python reading a pipe from the supervisor) learns each child's
  process group as it starts; when the pipe closes because the supervisor is gone, it SIGKILLs every
  group still listed: grandchildren a child spawned, and children spawned from another thread.
It needs no cooperation from the children, which may be any program.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from infra.errors import InfraError
from infra.runtime import agentstream_argv
from streams.config import EXIT_REPLAY

log = logging.getLogger(__name__)

AGENTSTREAM = tuple(agentstream_argv())
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # consecutive quick exits wait longer
STEADY_AFTER_S = 60.0  # a component that ran this long before exiting starts the backoff again
STOP_GRACE_S = 10.0
_PR_SET_PDEATHSIG = 1
# The guardian: "+<pgid>" adds a process group, "-<pgid>" removes it; at EOF it kills those left.
_GUARDIAN = """
import os, signal, sys
groups = set()
for line in sys.stdin:
    (groups.add if line[0] == "+" else groups.discard)(int(line[1:]))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


class StackError(InfraError):
    """A supervised component failed to start (the message names it and its log)."""


@dataclass(frozen=True)
class Component:
    """One supervised process: `<program> <args>` (program: the `agentstream` CLI)."""

    name: str
    args: tuple[str, ...]
    ready_file: str | None = None  # relative to the working directory; written when serving
    restart: Literal["always", "replay"] = "always"


@dataclass
class Running:
    """A component and its current process (None between an exit and its restart)."""

    component: Component
    popen: subprocess.Popen | None = None
    restarts: int = 0
    quick_exits: int = 0
    next_start: float = 0.0
    started_at: float = 0.0  # wall clock, for the state file
    started_mono: float = 0.0
    last_exit: int | None = None
    final: bool = False  # exited for good (restart policy `replay`, any code but EXIT_REPLAY)


def restart_delay(quick_exits: int) -> float:
    """Seconds before a restart after `quick_exits` consecutive quick exits.

    >>> restart_delay(0), restart_delay(1), restart_delay(99)
    (0.5, 1.0, 30.0)
    """
    return RESTART_BACKOFF_S[min(quick_exits, len(RESTART_BACKOFF_S) - 1)]


class Supervisor:
    """Starts components in order, restarts exited ones per their policy, stops them all cleanly."""

    def __init__(
        self,
        components: Sequence[Component],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        log_dir: Path | None = None,
        on_event: Callable[[str], None] | None = None,
        program: Sequence[str] = AGENTSTREAM,
    ):
        self.running = {c.name: Running(c) for c in components}
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.cwd = cwd
        self.log_dir = log_dir  # None: children write to this process's stdout / stderr
        self.on_event = on_event or (lambda message: log.info("%s", message))
        self.program = tuple(program)
        self._stopping = False
        self._signal: int | None = None
        self._guardian: subprocess.Popen | None = None
        self._guardian_fd: int | None = None

    # --- lifecycle --------------------------------------------------------------------------------

    def run(
        self,
        ready_timeout_s: float = 60.0,
        interval_s: float = 0.2,
        on_ready: Callable[[], None] | None = None,
    ) -> int:
        """Start, supervise until SIGTERM / SIGINT or a final exit, then stop everything.

        Returns 0 after a signal, 1 when a component exited for good."""
        previous = {sig: signal.signal(sig, self._record_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        final: list[str] = []
        try:
            self.start(ready_timeout_s)
            if on_ready is not None and self._signal is None:
                on_ready()
            while self._signal is None and not final:
                final = self.poll()
                time.sleep(interval_s)
            if self._signal is not None:
                self.on_event(f"{signal.Signals(self._signal).name} received; stopping")
            else:
                self.on_event(f"{', '.join(final)} exited for good; stopping the others")
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 1 if final and self._signal is None else 0

    def start(self, ready_timeout_s: float = 60.0) -> None:
        """Spawn every component in order, each after the one before it is ready."""
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        for entry in self.running.values():
            if self._signal is not None:
                return
            self._spawn(entry)
            if entry.component.ready_file:
                self._wait_ready(entry, ready_timeout_s)
            self._started(entry)
        self._changed()

    def poll(self) -> list[str]:
        """Check every component once and restart the exited ones that are due (call in a loop).
        Returns the names of components that exited for good."""
        now = time.monotonic()
        final = []
        for name, entry in self.running.items():
            if entry.popen is not None and entry.popen.poll() is not None:
                self._on_exit(entry, now)
            if entry.final:
                final.append(name)
            elif entry.popen is None and now >= entry.next_start and not self._stopping:
                self._spawn(entry)
                self.on_event(f"{name} restarted (restart #{entry.restarts})")
                self._changed()
        return final

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM each component's process group in reverse start order, SIGKILL it after `grace_s`."""
        self._stopping = True
        for entry in reversed(list(self.running.values())):
            popen, entry.popen = entry.popen, None
            if popen is None:
                continue
            _signal_group(popen.pid, signal.SIGTERM)
            try:
                popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.on_event(f"{entry.component.name} ignored SIGTERM for {grace_s:.0f}s; killing it")
            _signal_group(popen.pid, signal.SIGKILL)  # the leader, or what it left in its group
            entry.last_exit = popen.wait(timeout=10)
            self._guard("-", popen.pid)
        self._close_guardian()
        self._changed()

    def log_path(self, name: str) -> Path | None:
        return None if self.log_dir is None else self.log_dir / f"{name}.log"

    # --- hooks for a subclass (the stack writes its state file, creates topics) ----------------

    def _started(self, entry: Running) -> None:
        """Called once a component started by `start` is ready."""

    def _changed(self) -> None:
        """Called whenever a process started, exited or was stopped."""

    # --- internals --------------------------------------------------------------------------------

    def _record_signal(self, signum: int, _frame) -> None:
        self._signal = signum  # only a flag: the loop announces it and stops the tree

    def _spawn(self, entry: Running) -> None:
        component = entry.component
        if component.ready_file:
            self._workdir().joinpath(component.ready_file).unlink(missing_ok=True)
        log_path = self.log_path(component.name)
        log_file = open(log_path, "ab") if log_path else None  # noqa: SIM115 - the child keeps it
        try:
            entry.popen = subprocess.Popen(
                [*self.program, *component.args],
                stdout=log_file,
                stderr=subprocess.STDOUT if log_file else None,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=die_with_parent_hook(),
            )
        finally:
            if log_file is not None:
                log_file.close()
        self._guard("+", entry.popen.pid)
        entry.started_at, entry.started_mono = time.time(), time.monotonic()

    def _guard(self, sign: str, pgid: int) -> None:
        """Tell the guardian (started with the first child) about a process group."""
        if self._guardian_fd is None:
            read_fd, self._guardian_fd = os.pipe()  # not inherited by the children (PEP 446)
            self._guardian = subprocess.Popen(
                [sys.executable, "-c", _GUARDIAN], stdin=read_fd, start_new_session=True
            )
            os.close(read_fd)
        try:
            os.write(self._guardian_fd, f"{sign}{pgid}\n".encode())
        except OSError:  # the guardian died: PDEATHSIG and `stop` still apply
            log.warning("supervisor: the guardian process is gone (exit %s)", self._guardian.poll())

    def _close_guardian(self) -> None:
        if self._guardian_fd is not None:
            os.close(self._guardian_fd)
            self._guardian_fd = None
            self._guardian.wait(timeout=10)

    def _workdir(self) -> Path:
        return Path(self.cwd) if self.cwd is not None else Path.cwd()

    def _wait_ready(self, entry: Running, timeout_s: float) -> None:
        path = self._workdir() / entry.component.ready_file
        deadline = time.monotonic() + timeout_s
        while not path.exists() and self._signal is None:
            if entry.popen.poll() is not None:
                where = self.log_path(entry.component.name) or "its output above"
                raise StackError(
                    f"{entry.component.name} exited with {entry.popen.returncode} during start; see {where}"
                )
            if time.monotonic() > deadline:
                raise StackError(f"{entry.component.name} not ready after {timeout_s:.0f}s")
            time.sleep(0.05)

    def _on_exit(self, entry: Running, now: float) -> None:
        name, pid, code = entry.component.name, entry.popen.pid, entry.popen.returncode
        entry.last_exit, entry.popen = code, None
        _signal_group(pid, signal.SIGKILL)  # what it spawned dies with it, not beside its restart
        self._guard("-", pid)
        if self._stopping:
            return
        ran_s = now - entry.started_mono
        where = self.log_path(name) or "its output above"
        if entry.component.restart == "replay" and code != EXIT_REPLAY:
            entry.final = True
            self.on_event(f"{name} exited with code {code} after {ran_s:.0f}s; not restarted (see {where})")
            self._changed()
            return
        entry.quick_exits = 0 if ran_s >= STEADY_AFTER_S else entry.quick_exits + 1
        delay = restart_delay(entry.quick_exits)
        entry.restarts += 1
        entry.next_start = now + delay
        reason = "to replay from its committed offsets" if code == EXIT_REPLAY else f"with code {code}"
        self.on_event(f"{name} exited {reason} after {ran_s:.0f}s; restarting in {delay:.1f}s (log: {where})")
        self._changed()


def die_with_parent_hook() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child receive SIGKILL when this process dies (Linux only).

    None off Linux, and when called outside the main thread: the kernel would fire it when the
    spawning *thread* ends, killing a healthy child."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request was in place
            os._exit(1)

    return hook


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass

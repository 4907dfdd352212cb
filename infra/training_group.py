"""Launch and supervise a group of training ranks: `agentstream train --nproc N`.

Owns the rank processes only (it knows nothing about batches or weights):
- starts N copies of the same `agentstream train` command (`rank_argv`), each with the variables
  torchrun sets (`rank_env`: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT on a
  free port), so a rank joins the group exactly as it would under torchrun or `accelerate launch`;
- supervises them as one unit, like torchrun: when any rank exits non-zero or is killed, the others
  get SIGTERM (to their process groups), SIGKILL after a grace, and the whole group starts again on
  a new port, at most `max_restarts` times in a row; each restart is logged with the rank and its
  exit status. An attempt that ran `healthy_s` (10 minutes) before failing counts as healthy: the
  restarts start counting again, so a long run survives a rare failure a day but a group that keeps
  failing soon after starting gives up. A rank exiting 2 (a usage error: an option or a file the
  user named is wrong, the same on every start) stops the group at once, exit 2, no restart;
- on SIGTERM / SIGINT it passes SIGTERM to every rank (rank 0 finishes the batch in hand and tells
  the others to stop), SIGKILLs what is left after the grace, and returns 0.

A dead rank is found here (its exit), not by a collective timeout: the ranks use a long one.
No orphans: each rank runs in its own session and asks the kernel for SIGKILL when this launcher
dies (`infra.supervisor.die_with_parent_hook`), so a `kill -9` of the launcher takes its ranks down.

Exactly-once is not this module's business: a restarted group resumes from the latest checkpoint
and its committed offsets (`consumers.training.follow`), so killing ranks at any point is safe.
One machine only: every rank is a child of this process (several machines: use torchrun there).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from infra.errors import InfraError
from infra.supervisor import die_with_parent_hook

log = logging.getLogger(__name__)

GROUP_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
MASTER_ADDR = "127.0.0.1"
STOP_GRACE_S = 30.0  # a rank finishing the batch in hand before it stops
FINISH_GRACE_S = 120.0  # the other ranks, once rank 0 has exited 0
RESTART_DELAY_S = 1.0
HEALTHY_S = 600.0  # an attempt that ran this long before failing resets the restart count
USAGE_EXIT = 2  # argparse's exit code, and a rank's on a configuration error: restarting cannot help


class GroupError(InfraError):
    """A training group cannot be launched as asked (the message names the option and value)."""


def launched_rank(environ: Mapping[str, str]) -> bool:
    """True when a launcher (torchrun, `accelerate launch`, `--nproc`) started this process as a rank.

    >>> launched_rank({"WORLD_SIZE": "2", "RANK": "1"}), launched_rank({})
    (True, False)
    """
    return "WORLD_SIZE" in environ


def check_launch(nproc: int, environ: Mapping[str, str]) -> None:
    """Refuse `--nproc N` (N > 1) inside a process that is already a rank of a group."""
    if nproc > 1 and launched_rank(environ):
        raise GroupError(
            f"--nproc: {nproc} asked, but this process is already rank {environ.get('RANK')!r} of "
            f"WORLD_SIZE={environ.get('WORLD_SIZE')!r} (started by torchrun, accelerate or "
            "`agentstream train --nproc`); give --nproc 1 under a launcher"
        )


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def nproc_limit(device: str | None) -> tuple[int, str]:
    """(the most ranks this machine runs, what bounds them): CUDA devices with `--device cuda` (or
    no `--device` and CUDA available: the ranks would take cuda:0..N-1), else CPUs. Imports torch
    only when the device is not `cpu`."""
    if device is None or device.startswith("cuda"):
        import torch

        if device is not None or torch.cuda.is_available():
            return torch.cuda.device_count(), "CUDA devices"
    return usable_cpus(), "CPUs"


def check_nproc(nproc: int, limit: int, what: str) -> None:
    """Refuse more ranks than `limit` (one per CPU on CPU, one per GPU on CUDA).

    >>> check_nproc(2, 2, "CPUs")
    >>> try:
    ...     check_nproc(64, 2, "CPUs")
    ... except GroupError as exc:
    ...     print(exc)
    --nproc: 64 ranks asked, but there are 2 CPUs here (one rank each at most); give --nproc 2 or fewer
    """
    if nproc > limit:
        fix = f"give --nproc {limit} or fewer" if limit else "give --device cpu"
        raise GroupError(
            f"--nproc: {nproc} ranks asked, but there are {limit} {what} here (one rank each at most); {fix}"
        )


def check_restarts(nproc: int, max_restarts: int, default: int, environ: Mapping[str, str]) -> None:
    """Refuse `--max-restarts` (a value other than its default) for one process outside a launcher:
    restarts are the `--nproc N` launcher's, and one process has no launcher to restart it."""
    if nproc == 1 and max_restarts != default and not launched_rank(environ):
        raise GroupError(
            f"--max-restarts: {max_restarts} given with --nproc 1, but only a group launched with "
            "--nproc 2 or more is supervised and restarted; drop --max-restarts, or restart this "
            "process with a process supervisor (systemd, Kubernetes)"
        )


def rank_env(rank: int, world_size: int, port: int, threads: int | None = None) -> dict[str, str]:
    """The environment a rank joins its group with (torchrun's variables).

    >>> rank_env(1, 2, 29500)["RANK"], rank_env(1, 2, 29500, threads=4)["OMP_NUM_THREADS"]
    ('1', '4')
    """
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "MASTER_ADDR": MASTER_ADDR,
        "MASTER_PORT": str(port),
    }
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def threads_per_rank(nproc: int, environ: Mapping[str, str], cpus: int | None = None) -> int | None:
    """CPU threads per rank: the cores shared out (torch's default, all cores per rank, would make
    N ranks fight over them); None when the user set OMP_NUM_THREADS.

    >>> threads_per_rank(2, {}, cpus=16), threads_per_rank(4, {}, cpus=2)
    (8, 1)
    >>> threads_per_rank(2, {"OMP_NUM_THREADS": "3"}) is None
    True
    """
    if "OMP_NUM_THREADS" in environ:
        return None
    return max(1, (cpus or os.cpu_count() or 1) // nproc)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (rank 0 binds it; a race lost restarts the group)."""
    with socket.socket() as s:
        s.bind((MASTER_ADDR, 0))
        return s.getsockname()[1]


def exit_status(code: int) -> str:
    """An exit code as a person reads it.

    >>> exit_status(3), exit_status(-9)
    ('exited with code 3', 'was killed by SIGKILL')
    """
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass(frozen=True)
class RankExit:
    """How one rank ended one attempt."""

    attempt: int
    rank: int
    code: int


class TrainingGroup:
    """N rank processes of `argv`, supervised and restarted as one group."""

    def __init__(
        self,
        argv: Sequence[str],
        nproc: int,
        max_restarts: int,
        *,
        env: Mapping[str, str] | None = None,
        grace_s: float = STOP_GRACE_S,
        finish_grace_s: float = FINISH_GRACE_S,
        restart_delay_s: float = RESTART_DELAY_S,
        interval_s: float = 0.2,
        healthy_s: float = HEALTHY_S,
    ):
        if nproc < 1:
            raise GroupError(f"--nproc: expected at least 1, got {nproc}")
        if max_restarts < 0:
            raise GroupError(f"--max-restarts: expected 0 or more, got {max_restarts}")
        self.argv, self.nproc, self.max_restarts = list(argv), nproc, max_restarts
        base = dict(os.environ if env is None else env)
        self.threads = threads_per_rank(nproc, base)
        self.env = {**base, "PYTHONUNBUFFERED": "1"}
        self.grace_s, self.finish_grace_s = grace_s, finish_grace_s
        self.restart_delay_s, self.interval_s, self.healthy_s = restart_delay_s, interval_s, healthy_s
        self.ranks: list[subprocess.Popen] = []
        self.attempt = 0  # 0: the first start; n: the n-th restart
        self.restarts = 0  # restarts since the last healthy attempt (what --max-restarts bounds)
        self.started_at = 0.0  # when the current attempt started (time.monotonic)
        self.ports: list[int] = []  # the port of each attempt
        self.exits: list[RankExit] = []  # every rank that ended an attempt by failing
        self._signal: int | None = None

    def run(self) -> int:
        """Start the group and supervise it until every rank exits 0 (0), a signal (0), a rank's
        usage error (2), or a failure with no restart left (1)."""
        handlers = {s: signal.signal(s, self._record_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            return self.supervise()
        finally:
            self.stop(self.grace_s)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def supervise(self) -> int:
        """The loop of `run` (signal handlers are the caller's)."""
        self.start()
        while True:
            outcome = self._attempt()
            if outcome is not None:
                return outcome
            self.attempt += 1
            time.sleep(self.restart_delay_s)
            if self._signal is not None:
                return 0
            self.start()

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop the group as a signal to the launcher would (safe from another thread)."""
        self._signal = signum

    def start(self) -> None:
        """Spawn every rank of a new attempt on a fresh port."""
        port = free_port()
        self.ports.append(port)
        self.started_at = time.monotonic()
        self.ranks = [self._spawn(rank, port) for rank in range(self.nproc)]
        log.info(
            "train: started %d ranks on %s:%d (attempt %d, pids %s)",
            self.nproc, MASTER_ADDR, port, self.attempt + 1, [p.pid for p in self.ranks],
        )  # fmt: skip

    def stop(self, grace_s: float) -> None:
        """SIGTERM every running rank's process group, SIGKILL what is left after `grace_s`."""
        running = [p for p in self.ranks if p.poll() is None]
        for popen in running:
            _signal_group(popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for popen in running:
            try:
                popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning(
                    "train: rank %d ignored SIGTERM for %.0fs; killing it", self._rank(popen), grace_s
                )
        for popen in self.ranks:
            _signal_group(popen.pid, signal.SIGKILL)  # the rank, or what it left in its group
            popen.wait(timeout=10)

    # --- internals --------------------------------------------------------------------------------

    def _attempt(self) -> int | None:
        """Watch one attempt: the run's exit code, or None to restart the group."""
        finished_at: float | None = None
        while True:
            if self._signal is not None:
                log.info("train: %s received; stopping the ranks", signal.Signals(self._signal).name)
                self.stop(self.grace_s)
                return 0
            codes = [p.poll() for p in self.ranks]
            failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                return self._on_failure(failed)
            if all(code == 0 for code in codes):
                return 0
            if codes[0] == 0:
                finished_at = finished_at or time.monotonic()
                if time.monotonic() - finished_at > self.finish_grace_s:
                    return self._stragglers(codes)
            time.sleep(self.interval_s)

    def _on_failure(self, failed: list[tuple[int, int]]) -> int | None:
        for rank, code in failed:
            self.exits.append(RankExit(self.attempt, rank, code))
        usage = [(rank, code) for rank, code in failed if code == USAGE_EXIT]
        rank, code = (usage or failed)[0]
        ran = time.monotonic() - self.started_at
        self.stop(self.grace_s)
        if usage:
            log.error(
                "train: rank %d exited with code %d, a usage error (its message is above); "
                "not restarting: it would fail the same way",
                rank, code,
            )  # fmt: skip
            return USAGE_EXIT
        if ran >= self.healthy_s and self.restarts:
            log.info(
                "train: attempt %d ran %.0fs before failing (healthy, >= %.0fs): the restart count "
                "starts again", self.attempt + 1, ran, self.healthy_s,
            )  # fmt: skip
            self.restarts = 0
        if self.restarts >= self.max_restarts:
            log.error(
                "train: rank %d %s; %d restarts in a row used (--max-restarts %d); giving up",
                rank, exit_status(code), self.restarts, self.max_restarts,
            )  # fmt: skip
            return 1
        self.restarts += 1
        log.warning(
            "train: rank %d %s; stopped the other ranks, restarting the group "
            "(restart %d of %d, a new port)",
            rank, exit_status(code), self.restarts, self.max_restarts,
        )  # fmt: skip
        return None

    def _stragglers(self, codes: list[int | None]) -> int:
        left = [rank for rank, code in enumerate(codes) if code is None]
        log.error(
            "train: rank 0 finished but ranks %s were still running %.0fs later; stopping them",
            left, self.finish_grace_s,
        )  # fmt: skip
        self.stop(self.grace_s)
        return 1

    def _spawn(self, rank: int, port: int) -> subprocess.Popen:
        return subprocess.Popen(
            self.argv,
            env={**self.env, **rank_env(rank, self.nproc, port, self.threads)},
            start_new_session=True,
            preexec_fn=die_with_parent_hook(),
        )

    def _rank(self, popen: subprocess.Popen) -> int:
        return self.ranks.index(popen)

    def _record_signal(self, signum: int, _frame) -> None:
        self._signal = signum  # only a flag: the loop stops the ranks


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass

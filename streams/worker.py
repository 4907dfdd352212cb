"""`agentstream worker`: run stream processor roles as faust workers.

One role runs in this process (`faust.Worker` on the app from `streams.app.create_app`). Several
roles run as one child process per role (each its own faust app and consumer group), supervised
here: when one child exits, the others are stopped and the worker exits non-zero; SIGTERM/SIGINT
are passed on to the children, with SIGKILL after a grace period (faust can ignore SIGTERM).
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from dataclasses import replace

from clients.kafka import ensure_topics
from schemas import topics
from streams.app import create_app, import_faust
from streams.config import EXIT_REPLAY, WorkerConfig, WorkerConfigError

log = logging.getLogger(__name__)
CHILD_STOP_GRACE_S = 10.0
REPLAY_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # consecutive quick replay exits wait longer
STEADY_AFTER_S = 60.0  # a role that ran this long before exiting starts the backoff again


def main(config: WorkerConfig, args) -> int:
    ensure_topics(config.bootstrap_servers)
    config = replace(config, partitions=source_partitions(config.bootstrap_servers))
    if len(config.roles) == 1:
        return run_role(config, config.roles[0], args.log_level)
    return supervise(config, args)


def source_partitions(bootstrap: str) -> int:
    """The partition count shared by every topic a processor reads (the state tables use the same,
    so a trajectory's state lives in the partition of its events). Differing counts are refused:
    faust would silently recover only some table partitions."""
    from kafka import KafkaConsumer

    names = (topics.AGENT_EVENTS, topics.REWARD_RULE, topics.REWARD_JUDGE, topics.FEEDBACK_HUMAN)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        counts = {name: len(consumer.partitions_for_topic(name) or ()) for name in names}
    finally:
        consumer.close()
    if len(set(counts.values())) != 1 or 0 in counts.values():
        detail = ", ".join(f"{k}={v}" for k, v in counts.items())
        raise WorkerConfigError(
            f"source topics must have the same number of partitions, got {detail} "
            "(create them with `agentstream topics create` before producing)"
        )
    return next(iter(counts.values()))


def run_role(config: WorkerConfig, role: str, log_level: str = "INFO") -> int:
    """Run one role's faust worker in this process until it is stopped."""
    faust = import_faust()
    app = create_app(config, role)
    worker = faust.Worker(app, loglevel=str(log_level).lower(), quiet=True, override_logging=False)
    worker.execute_from_commandline()  # returns (or exits) when the worker stops
    return 0


def _child_args(args, role: str) -> list[str]:
    argv = [sys.executable, "-m", "infra.cli", "worker", "--roles", role]
    for flag, dest in _FORWARDED:
        value = getattr(args, dest, None)
        if value is not None:
            argv += [flag, str(value)]
    return argv


_FORWARDED = [
    ("--bootstrap-servers", "bootstrap_servers"),
    ("--clickhouse-url", "clickhouse_url"),
    ("--data-dir", "data_dir"),
    ("--log-level", "log_level"),
    ("--profiles", "profiles_path"),
    ("--judge-rules", "judge_rules_path"),
    ("--grace-seconds", "grace_seconds"),
    ("--batch-max", "batch_max"),
    ("--batch-within", "batch_within_s"),
    ("--reward-version", "reward_version"),
]


def supervise(config: WorkerConfig, args) -> int:
    """One child process per role. A role that exits with EXIT_REPLAY is restarted (with backoff);
    any other exit stops them all, as does SIGTERM / SIGINT."""
    children = {role: _RoleChild(role, _child_args(args, role)) for role in config.roles}
    log.info("worker: roles %s as pids %s", ",".join(children), [c.popen.pid for c in children.values()])
    stopping = {"signal": None}

    def on_signal(signum, _frame):
        stopping["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    failed = None
    while stopping["signal"] is None and failed is None:
        for child in children.values():
            if not child.poll_and_maybe_restart():
                failed = child
                break
        time.sleep(0.2)
    if failed is not None:
        log.error("worker: role %s exited with %s; stopping the others", failed.role, failed.popen.returncode)
    _stop_children({role: c.popen for role, c in children.items()})
    return 0 if stopping["signal"] is not None else 1


class _RoleChild:
    """One role's process; restarted after an EXIT_REPLAY exit once its backoff has passed."""

    def __init__(self, role: str, argv: list[str]):
        self.role, self.argv = role, argv
        self.quick_exits = 0
        self.restart_at: float | None = None
        self._start()

    def _start(self) -> None:
        self.popen = subprocess.Popen(self.argv)
        self.started = time.monotonic()
        self.restart_at = None

    def poll_and_maybe_restart(self) -> bool:
        """False when the role exited for good (any code but EXIT_REPLAY)."""
        if self.restart_at is not None:
            if time.monotonic() >= self.restart_at:
                self._start()
                log.warning("worker: role %s restarted as pid %d", self.role, self.popen.pid)
            return True
        code = self.popen.poll()
        if code is None:
            return True
        if code != EXIT_REPLAY:
            return False
        ran_s = time.monotonic() - self.started
        self.quick_exits = 0 if ran_s >= STEADY_AFTER_S else self.quick_exits + 1
        delay = REPLAY_BACKOFF_S[min(self.quick_exits, len(REPLAY_BACKOFF_S) - 1)]
        log.warning(
            "worker: role %s exited to replay from its committed offsets (after %.0fs); restarting in %.1fs",
            self.role,
            ran_s,
            delay,
        )
        self.restart_at = time.monotonic() + delay
        return True


def _stop_children(children: dict[str, subprocess.Popen]) -> None:
    for proc in children.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + CHILD_STOP_GRACE_S
    for role, proc in children.items():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("worker: role %s ignored SIGTERM; killing pid %d", role, proc.pid)
            proc.kill()
            proc.wait(timeout=10)

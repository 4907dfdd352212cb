"""Child processes for benchmarks: an `agentstream` subcommand in its own process group that
writes a ready file when serving; stopped by PID (SIGTERM, then SIGKILL). `scratch_broker` gives a
benchmark its scratch directory with an embedded broker in it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from infra.runtime import agentstream_argv

AGENTSTREAM = agentstream_argv()


class Child:
    """A child process in its own group, stopped by PID (SIGTERM, then SIGKILL)."""

    def __init__(self, args: list[str], log_path: Path, ready_file: Path, timeout_s: float = 30.0):
        self.log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.popen = subprocess.Popen(
            args, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        while not (ready_file.exists() and ready_file.read_text().strip()):
            if self.popen.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{args[3]} did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        self.address = ready_file.read_text().strip()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        self.log.close()


def start_broker(directory: Path) -> Child:
    directory.mkdir(parents=True, exist_ok=True)
    ready = directory / "broker.ready"
    args = [*AGENTSTREAM, "broker", "--data-dir", str(directory), "--host", "127.0.0.1", "--port", "0"]
    return Child([*args, "--ready-file", str(ready)], directory / "broker.log", ready)


@contextlib.contextmanager
def scratch_broker(bench: str) -> Iterator[tuple[Path, Child]]:
    """A scratch directory for one benchmark run and an embedded broker in it; both go after the block."""
    with tempfile.TemporaryDirectory(prefix=f"agentstream-bench-{bench}-") as tmp:
        root = Path(tmp)
        with start_broker(root / "broker") as broker:
            yield root, broker

"""One process in a running container through the Engine API's exec, under a host-side deadline.

`run_exec` creates an exec (an argv list, never a formatted string), attaches to its hijacked
socket, sends the stdin bytes and half-closes, then reads Docker's multiplexed stream (frames of an
8-byte header: stream id, three zero bytes, big-endian length) until the end or the deadline.
Everything that arrives is hostile: a frame's length is never trusted for buffering (payload goes
to the sink as it arrives, and sinks keep only up to their caps), a malformed header is a
`SandboxError`, and the exit code is read back from the engine, not from the stream.

It must not decide what a deadline means: it reports `timed_out` and the owner of the container
(`container.py`) kills and restarts it.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import IO, Any

from producers.sandbox.errors import SandboxError

__all__ = ["Combined", "ExecOutcome", "Split", "run_exec"]

STDOUT, STDERR = 1, 2
CHUNK = 65536
EXIT_CODE_WAIT_S = 2.0  # the engine records the exit code just after the stream ends


@dataclass(frozen=True)
class ExecOutcome:
    """How one exec ended: its exit code (None when unknown) and whether the deadline passed."""

    exit_code: int | None
    timed_out: bool


class Combined:
    """stdout and stderr in arrival order, the first `limit` + 1 bytes kept (so a cut shows);
    stderr's first 4 KiB are also kept apart (the wrapper reports refusals there)."""

    STDERR_KEEP = 4096

    def __init__(self, limit: int):
        self.limit = limit
        self._parts: list[bytes] = []
        self._kept = 0
        self._stderr = bytearray()

    def feed(self, stream: int, data: bytes) -> None:
        if self._kept <= self.limit:
            piece = data[: self.limit + 1 - self._kept]
            self._parts.append(piece)
            self._kept += len(piece)
        if stream == STDERR and len(self._stderr) < self.STDERR_KEEP:
            self._stderr += data[: self.STDERR_KEEP - len(self._stderr)]

    @property
    def data(self) -> bytes:
        return b"".join(self._parts)

    @property
    def stderr(self) -> str:
        return self._stderr.decode("utf-8", errors="replace")


class Split:
    """stdout into a binary file up to `limit` bytes (`overflow` past it), stderr's start apart."""

    def __init__(self, out: IO[bytes], limit: int):
        self.out, self.limit, self.written, self.overflow = out, limit, 0, False
        self._stderr = bytearray()

    def feed(self, stream: int, data: bytes) -> None:
        if stream != STDERR:
            room = self.limit - self.written
            if len(data) > room:
                self.overflow = True
                data = data[: max(room, 0)]
            self.out.write(data)
            self.written += len(data)
        elif len(self._stderr) < Combined.STDERR_KEEP:
            self._stderr += data[: Combined.STDERR_KEEP - len(self._stderr)]

    @property
    def stderr(self) -> str:
        return self._stderr.decode("utf-8", errors="replace")


class _Frames:
    """Docker's stream multiplexing, parsed incrementally: payload goes to the sink as it comes."""

    def __init__(self, sink: Combined | Split):
        self.sink = sink
        self.head = b""
        self.stream = 0
        self.left = 0

    def feed(self, data: bytes) -> None:
        i = 0
        while i < len(data):
            if self.left == 0:
                need = 8 - len(self.head)
                self.head += data[i : i + need]
                i += need
                if len(self.head) < 8:
                    return
                stream, zeros, size = self.head[0], self.head[1:4], int.from_bytes(self.head[4:8], "big")
                if stream not in (0, STDOUT, STDERR) or zeros != b"\0\0\0":
                    raise SandboxError(f"malformed exec stream header from the engine: {self.head!r}")
                self.head, self.stream, self.left = b"", stream, size
                continue
            piece = data[i : i + self.left]
            i += len(piece)
            self.left -= len(piece)
            self.sink.feed(self.stream, piece)


def run_exec(
    api: Any,
    container_id: str,
    argv: list[str],
    *,
    user: str,
    env: dict[str, str],
    stdin: IO[bytes] | None,
    sink: Combined | Split,
    deadline: float,
) -> ExecOutcome:
    """Run `argv` in the container, `stdin` fed to it, output into `sink`, until `deadline`
    (a `time.monotonic()` value). On the deadline the process is NOT killed here."""
    exec_id = api.exec_create(
        container_id, argv, stdin=True, stdout=True, stderr=True, user=user, environment=env, workdir="/"
    )["Id"]
    response = api.exec_start(exec_id, socket=True)
    raw = getattr(response, "_sock", response)
    try:
        finished = _send(raw, stdin, deadline) and _receive(raw, _Frames(sink), deadline)
    finally:
        response.close()
        raw.close()
    if not finished:
        return ExecOutcome(None, True)
    return ExecOutcome(_exit_code(api, exec_id), False)


def _send(raw: Any, stdin: IO[bytes] | None, deadline: float) -> bool:
    """Write all of `stdin`, then half-close so the process sees its end; False past the deadline."""
    try:
        while stdin is not None and (chunk := stdin.read(CHUNK)):
            raw.settimeout(_left(deadline))
            raw.sendall(chunk)
        raw.shutdown(socket.SHUT_WR)
    except (TimeoutError, _Expired):
        return False
    except OSError:
        pass  # the process ended before reading everything: its output and exit code say why
    return True


def _receive(raw: Any, frames: _Frames, deadline: float) -> bool:
    """Read frames until the stream ends (True) or the deadline passes (False)."""
    try:
        while True:
            raw.settimeout(_left(deadline))
            chunk = raw.recv(CHUNK)
            if not chunk:
                return True
            frames.feed(chunk)
    except (TimeoutError, _Expired):
        return False
    except ConnectionError:
        return True  # the engine dropped the attachment (the container died): the exit code says how


class _Expired(SandboxError):
    """The host-side deadline of one exec passed (never leaves this module)."""


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Expired
    return left


def _exit_code(api: Any, exec_id: str) -> int | None:
    """The exec's exit code as the engine recorded it (None if it never says)."""
    until = time.monotonic() + EXIT_CODE_WAIT_S
    while True:
        info = api.exec_inspect(exec_id)
        if not info.get("Running") and info.get("ExitCode") is not None:
            return int(info["ExitCode"])
        if time.monotonic() > until:
            return None
        time.sleep(0.005)

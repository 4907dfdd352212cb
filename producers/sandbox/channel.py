"""The host's end of the wire to a local sandbox's `inside` program, and the tar streams over it.

One request, one reply, under a deadline (frames as `inside` describes them). Everything coming
back is hostile: frames and bodies are bounded, the reply header must be a JSON object, and any
violation, an early end of file or a missed deadline is a `ChannelError` (the caller then kills
the sandbox). `send_tree` streams a host directory in as a tar (for `reset`); `extract_snapshot`
extracts the workspace's tar into a host directory with tarfile's "data" filter (for `snapshot`).

It must not interpret agent paths on the host: only the tar filter decides what lands in `target`.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from producers.sandbox.errors import SandboxError
from producers.sandbox.inside import CHUNK, FRAME

__all__ = ["Channel", "ChannelError", "extract_snapshot", "send_tree"]

log = logging.getLogger(__name__)

MAX_HEADER = 1 << 20


class ChannelError(SandboxError):
    """The program inside broke the protocol, went away, or missed the deadline (`timed_out`)."""

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


class Channel:
    """Requests to one program over its stdin/stdout pipes (non-blocking, with deadlines)."""

    def __init__(self, proc: subprocess.Popen):
        assert proc.stdin is not None and proc.stdout is not None
        self._stdin, self._stdout = proc.stdin, proc.stdout
        self._w, self._r = proc.stdin.fileno(), proc.stdout.fileno()
        os.set_blocking(self._w, False)
        os.set_blocking(self._r, False)
        self._buf = bytearray()
        self.deadline = 0.0

    def call(
        self,
        request: dict[str, Any],
        deadline: float,
        body: Callable[[Channel], None] | None = None,
        sink: Callable[[BodyReader], None] | None = None,
        max_body: int = 0,
    ) -> tuple[dict[str, Any], bytes]:
        """Send `request` (and the body `body` writes), read the reply: its body (given to `sink`,
        or returned) and its header. A `sink` failure is raised after the reply is read."""
        self.deadline = deadline
        header = json.dumps(request).encode()
        if body is None:
            self._write(FRAME.pack(len(header)) + header + FRAME.pack(0))
        else:
            self._write(FRAME.pack(len(header)) + header)
            body(self)
            self._write(FRAME.pack(0))
        reader = BodyReader(self, max_body)
        failure: Exception | None = None
        data = b""
        if sink is None:
            data = reader.read()
        else:
            try:
                sink(reader)
            except (tarfile.TarError, OSError, ValueError) as exc:
                failure = exc
            reader.drain()
        reply = self._reply()
        if failure is not None and "error" not in reply:
            reply = {"error": f"{type(failure).__name__}: {failure}", "refused": False}
        return reply, data

    def send_body(self, data: bytes) -> None:
        for start in range(0, len(data), CHUNK):
            piece = data[start : start + CHUNK]
            self._write(FRAME.pack(len(piece)) + piece)

    def close(self) -> None:
        for pipe in (self._stdin, self._stdout):
            try:
                pipe.close()
            except OSError:
                continue

    def frame(self, limit: int) -> bytes:
        """One frame of at most `limit` bytes."""
        (size,) = FRAME.unpack(self._take(FRAME.size))
        if size > limit:
            raise ChannelError(f"the sandbox sent a frame of {size} bytes (limit {limit})")
        return self._take(size)

    def _reply(self) -> dict[str, Any]:
        raw = self.frame(MAX_HEADER)
        try:
            reply = json.loads(raw)
        except ValueError as exc:
            raise ChannelError(f"the sandbox's reply is not JSON: {exc}; starts {raw[:100]!r}") from None
        if not isinstance(reply, dict):
            raise ChannelError(f"the sandbox's reply is not an object: {raw[:100]!r}")
        return reply

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ChannelError("the sandbox did not answer in time", timed_out=True)
        return left

    def _take(self, n: int) -> bytes:
        while len(self._buf) < n:
            ready, _, _ = select.select([self._r], [], [], self._left())
            if not ready:
                continue
            try:
                piece = os.read(self._r, max(65536, n - len(self._buf)))
            except BlockingIOError:
                continue
            except OSError as exc:
                raise ChannelError(f"reading from the sandbox failed: {exc}") from None
            if not piece:
                raise ChannelError("the sandbox's program exited")
            self._buf += piece
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            _, ready, _ = select.select([], [self._w], [], self._left())
            if not ready:
                continue
            try:
                view = view[os.write(self._w, view) :]
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise ChannelError("the sandbox's program exited (its stdin is closed)") from None
            except OSError as exc:
                raise ChannelError(f"writing to the sandbox failed: {exc}") from None


class BodyReader:
    """A reply body as a file (`read(n)`), frame by frame, refused past `limit` bytes in all."""

    def __init__(self, channel: Channel, limit: int):
        self._channel, self._limit = channel, limit
        self._left, self._pos, self._total, self._ended = b"", 0, 0, False

    def read(self, n: int = -1) -> bytes:
        while not self._ended and (n < 0 or len(self._left) - self._pos < n):
            piece = self._channel.frame(CHUNK)
            self._total += len(piece)
            if self._total > self._limit:
                raise ChannelError(f"the sandbox's reply is over {self._limit} bytes")
            self._ended = not piece
            self._left, self._pos = self._left[self._pos :] + piece, 0  # one copy per frame
        end = len(self._left) if n < 0 else min(len(self._left), self._pos + n)
        data, self._pos = self._left[self._pos : end], end
        return data

    def drain(self) -> None:
        while not self._ended:
            self.read(CHUNK)


class _FrameWriter:
    """A file that sends what is written as body frames (for tarfile's stream mode)."""

    def __init__(self, channel: Channel):
        self._channel, self._pending = channel, bytearray()

    def write(self, data: bytes) -> int:
        self._pending += data
        if len(self._pending) >= CHUNK:
            self.flush()
        return len(data)

    def flush(self) -> None:
        if self._pending:
            self._channel.send_body(bytes(self._pending))
            self._pending = bytearray()


def send_tree(channel: Channel, root: Path) -> None:
    """`root`'s contents as a tar body (symlinks as links, modes kept)."""
    writer = _FrameWriter(channel)
    with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for child in sorted(root.iterdir()):
            tar.add(child, arcname=child.name)
    writer.flush()


def extract_snapshot(reader: BodyReader, target: Path) -> None:
    """Extract the workspace's tar stream into `target` with the "data" filter; a link pointing
    outside `target` is left out (logged), anything else the filter refuses fails the snapshot."""
    with tarfile.open(fileobj=reader, mode="r|") as tar:  # type: ignore[call-overload]
        tar.extractall(target, filter=_snapshot_filter)


def _snapshot_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    try:
        return tarfile.data_filter(member, dest)
    except tarfile.FilterError as exc:
        if member.issym() or member.islnk():
            log.warning("sandbox snapshot: link %r left out: %s", member.name, exc)
            return None
        raise

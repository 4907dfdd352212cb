"""The host's end of the wire treats the sandbox's answers as hostile: an oversized frame, a reply
that is not JSON, a body over its limit, a program that exits or never answers are each a
`ChannelError` (never a hang or a crash), and a sandbox whose init stops answering is killed,
reported as timed out, and replaced on reset."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from producers.sandbox import local
from producers.sandbox.channel import Channel, ChannelError
from producers.sandbox.inside import descendants
from producers.sandbox.local import Limits, LocalSandbox

END = "sys.stdout.buffer.write(struct.pack('>I', 0))"


def _program(body: str) -> subprocess.Popen:
    """A fake init: reads nothing, writes `body` (Python) to stdout, then sleeps."""
    code = f"import struct, sys, time\n{body}\nsys.stdout.flush()\ntime.sleep(30)"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("sys.stdout.buffer.write(b'\\x7f\\xff\\xff\\xff')", "frame of 2147483647 bytes"),
        (f"{END}; sys.stdout.buffer.write(struct.pack('>I', 3) + b'{{x]')", "not JSON"),
        (f"{END}; sys.stdout.buffer.write(struct.pack('>I', 2) + b'[]')", "not an object"),
        ("sys.stdout.buffer.write(struct.pack('>I', 5) + b'12345' + struct.pack('>I', 0))", "over 4 bytes"),
        ("sys.exit(0)", "exited"),
        ("pass", "did not answer in time"),
    ],
)
def test_a_hostile_or_silent_program_is_a_channel_error(body, message):
    proc = _program(body)
    channel = Channel(proc)
    start = time.monotonic()
    try:
        with pytest.raises(ChannelError, match=message):
            channel.call({"op": "hello"}, time.monotonic() + 2, max_body=4)
        assert time.monotonic() - start < 5
    finally:
        channel.close()
        proc.kill()
        proc.wait()


def test_an_init_that_stops_answering_is_killed_and_the_call_times_out(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("stopping the init from the host needs its host pid's owner (root here)")
    monkeypatch.setattr(local, "ANSWER_MARGIN_S", 0.5)
    with LocalSandbox(limits=Limits(timeout_s=1)) as box:
        init = descendants(box._boundary.proc.pid)[0]
        os.kill(init, signal.SIGSTOP)
        start = time.monotonic()
        result = box.run("shell", {"command": ["true"]})
        assert result.timed_out and "did not answer within 1.5s" in result.error
        assert time.monotonic() - start < 5
        assert "broken" in box.run("shell", {"command": ["true"]}).error
        box.reset()
        assert box.run("shell", {"command": ["echo", "new"]}).output == "new\n"

"""The sandbox's one exception: `SandboxError(ProducerError)`.

Raised for a path that escapes the workspace, a bad tool parameter, a sandbox used after `close()`
or a backend that cannot start. `Sandbox.run` turns it into a `ToolResult` with exit_code 1, so an
agent sees the message instead of a traceback.
"""

from __future__ import annotations

from producers.errors import ProducerError


class SandboxError(ProducerError):
    """A sandbox refused a request (path outside the workspace, bad parameter) or cannot run."""
